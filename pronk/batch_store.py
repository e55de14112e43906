"""Batch records: one JSON object per batch under the store (a local folder or S3)."""

from __future__ import annotations

from pronk import storage
from pronk.schemas import Batch
from pronk.settings import Settings, get_settings


class BatchStore:
    def __init__(self, settings: Settings | None = None):
        self.settings = settings or get_settings()
        self.root = storage.join(self.settings.store_uri, "batches")

    def _uri(self, batch_id: str) -> str:
        return storage.join(self.root, f"{batch_id}.json")

    def save(self, batch: Batch) -> None:
        storage.write_bytes(self._uri(batch.id), batch.model_dump_json().encode(), self.settings)

    def load(self, batch_id: str) -> Batch:
        return Batch.model_validate_json(storage.read_bytes(self._uri(batch_id), self.settings))

    def exists(self, batch_id: str) -> bool:
        return storage.filesystem(self.root, self.settings).exists(self._uri(batch_id))
