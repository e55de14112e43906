"""Bearer API keys, stored hashed under `<store>/api_keys/<sha256 of the key>.json`.

A key is 32 random bytes, so a plain SHA-256 is enough (a slow password hash protects guessable
secrets, not random ones) and a lookup is one read by name. The plaintext is shown once, at creation.
Keys that share an owner share files and batches; by default each key is its own owner.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time

from pydantic import BaseModel, Field

from pronk import storage
from pronk.batches.owner_index import check_owner
from pronk.settings import Settings

KEY_PREFIX = "pk-"
KEY_PATTERN = re.compile(r"pk-[A-Za-z0-9_-]{16,128}")
"""What a key looks like (`pk-` and URL-safe base64); anything else is refused before any lookup."""
KEY_ID_PATTERN = re.compile(r"key_[0-9a-f]{12}")


class ApiKey(BaseModel):
    key_id: str = Field(description="Public id of the key (`key_` and 12 hex digits), safe to show and log.")
    owner: str = Field(description="Whose files and batches the key reaches.")
    name: str = Field(default="", description="A note for people: what the key is for.")
    created_at: int = Field(default_factory=lambda: int(time.time()))
    hint: str = Field(description="First and last characters of the key, to recognise it.")
    admin: bool = Field(
        default=False, description="May upload weights and Leap fleets (`pronk keys create --admin`); shared state."
    )


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyStore:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(self.settings.store_uri, "api_keys")

    def _uri(self, digest: str) -> str:
        return storage.join(self.root, f"{digest}.json")

    def create(self, owner: str | None = None, name: str = "", admin: bool = False) -> tuple[str, ApiKey]:
        """Make a key; returns the plaintext (shown once) and its stored record."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = f"key_{secrets.token_hex(6)}"
        record = ApiKey(
            key_id=key_id, owner=check_owner(owner or key_id), name=name, hint=f"{key[:6]}...{key[-4:]}", admin=admin
        )
        storage.write_bytes(self._uri(key_hash(key)), record.model_dump_json().encode(), self.settings)
        return key, record

    def lookup(self, key: str) -> ApiKey | None:
        if KEY_PATTERN.fullmatch(key) is None:
            return None
        try:
            return ApiKey.model_validate_json(storage.read_bytes(self._uri(key_hash(key)), self.settings))
        except FileNotFoundError:
            return None

    def _all(self) -> dict[str, ApiKey]:
        names = storage.list_names(self.root, self.settings)
        uris = [storage.join(self.root, name) for name in names if name.endswith(".json")]
        return {
            uri: ApiKey.model_validate_json(data)
            for uri, data in zip(uris, storage.read_many(uris, self.settings), strict=True)
            if data is not None
        }

    def list(self) -> list[ApiKey]:
        return sorted(self._all().values(), key=lambda k: k.created_at)

    def revoke(self, key_id: str) -> bool:
        if KEY_ID_PATTERN.fullmatch(key_id) is None:
            return False
        for uri, record in self._all().items():
            if record.key_id == key_id:
                storage.delete(uri, self.settings)
                return True
        return False
