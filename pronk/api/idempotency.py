"""`Idempotency-Key` on `POST /v1/batches`: a client that retries a create (a timeout, a dropped connection) gets
the batch its first try made instead of a second one.

The key is remembered per owner under the store (`idempotency/<owner>/<sha256 of the key>.json`, so no key
becomes a path) with the batch id and a hash of the request body, for as long as that batch record exists. A
retry with the same body gets that batch back; the same key with another body is a 409, as Stripe answers.
Concurrent tries of one key in one API process wait on one lock, so exactly one of them creates.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import BaseModel

from pronk import storage
from pronk.api.error_responses import ApiError
from pronk.settings import Settings

HEADER = "Idempotency-Key"
KEY_PATTERN = re.compile(r"[\x21-\x7e]{1,255}")


class Remembered(BaseModel):
    batch_id: str
    request_sha256: str


def check_key(key: str) -> str:
    if not KEY_PATTERN.fullmatch(key):
        raise ApiError(
            400, f"{HEADER} must be 1-255 printable ASCII characters without spaces.", param=HEADER, code="invalid_key"
        )
    return key


def request_hash(body: BaseModel) -> str:
    return hashlib.sha256(body.model_dump_json().encode()).hexdigest()


class IdempotencyKeys:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(settings.store_uri, "idempotency")
        self.locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()

    def _uri(self, owner: str, key: str) -> str:
        return storage.join(self.root, owner, f"{hashlib.sha256(key.encode()).hexdigest()}.json")

    @asynccontextmanager
    async def held(self, owner: str, key: str) -> AsyncIterator[None]:
        """One create at a time per (owner, key) in this process."""
        lock = self.locks.get((owner, key))
        if lock is None:
            lock = self.locks[(owner, key)] = asyncio.Lock()  # lives while a create holds or waits on it
        async with lock:
            yield

    def find(self, owner: str, key: str) -> Remembered | None:
        try:
            return Remembered.model_validate_json(storage.read_bytes(self._uri(owner, key), self.settings))
        except FileNotFoundError:
            return None

    def remember(self, owner: str, key: str, remembered: Remembered) -> None:
        storage.write_bytes(self._uri(owner, key), remembered.model_dump_json().encode(), self.settings)
