"""Batch records: one JSON object per batch under the store (a local folder or S3).

A cancel request is its own object (`<id>.cancel`), written only by the API and never by the flow,
so a flow saving its progress can never erase it; `load` shows such a batch as `cancelling` until
the flow adopts the status or ends it.
"""

from __future__ import annotations

import builtins
import time

from pronk import storage
from pronk.batches.owner_index import OwnerIndex
from pronk.batches.schemas import TERMINAL_STATUSES, Batch
from pronk.settings import Settings


class BatchStore:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.root = storage.join(self.settings.store_uri, "batches")
        self.owners = OwnerIndex(storage.join(self.settings.store_uri, "batch_owners"), self.settings)

    def _uri(self, batch_id: str) -> str:
        return storage.join(self.root, f"{batch_id}.json")

    def save(self, batch: Batch) -> None:
        storage.write_bytes(self._uri(batch.id), batch.model_dump_json().encode(), self.settings)

    def load(self, batch_id: str) -> Batch:
        batch = Batch.model_validate_json(storage.read_bytes(self._uri(batch_id), self.settings))
        return self._with_cancel_request(batch, self._read_cancel(batch_id) if self._cancellable(batch) else None)

    def create(self, batch: Batch) -> None:
        """Save a new batch and list it under its owner."""
        self.save(batch)
        if batch.owner is not None:
            self.owners.add(batch.owner, batch.id)

    def list(self, owner: str, after: str | None, limit: int) -> tuple[list[Batch], bool]:
        """A page of the owner's batches, newest first, and whether more follow."""
        page = self.owners.page(owner, after, limit)
        batches = [
            Batch.model_validate_json(d)
            for d in storage.read_many([self._uri(i) for i in page.ids], self.settings)
            if d
        ]
        pending = [b for b in batches if self._cancellable(b)]
        requests = storage.read_many([self._cancel_uri(b.id) for b in pending], self.settings)
        for batch, request in zip(pending, requests):
            self._with_cancel_request(batch, request)
        return batches, page.has_more

    def _cancel_uri(self, batch_id: str) -> str:
        return storage.join(self.root, f"{batch_id}.cancel")

    def request_cancel(self, batch_id: str) -> None:
        storage.write_bytes(self._cancel_uri(batch_id), str(int(time.time())).encode(), self.settings)

    def _read_cancel(self, batch_id: str) -> bytes | None:
        try:
            return storage.read_bytes(self._cancel_uri(batch_id), self.settings)
        except FileNotFoundError:
            return None

    def cancel_requested(self, batch_id: str) -> bool:
        return self._read_cancel(batch_id) is not None

    @staticmethod
    def _cancellable(batch: Batch) -> bool:
        return batch.status not in TERMINAL_STATUSES and batch.status != "cancelling"

    @staticmethod
    def _with_cancel_request(batch: Batch, request: bytes | None) -> Batch:
        if request is not None and BatchStore._cancellable(batch):
            batch.status = "cancelling"
            batch.cancelling_at = int(request)
        return batch

    def records(self) -> builtins.list[Batch]:
        """Every batch record in the store, newest first; unreadable records are skipped."""
        names = [n for n in storage.list_names(self.root, self.settings) if n.endswith(".json")]
        batches = []
        for data in storage.read_many([storage.join(self.root, n) for n in names], self.settings):
            if not data:
                continue
            try:
                batches.append(Batch.model_validate_json(data))
            except ValueError:
                continue
        batches.sort(key=lambda b: (b.created_at, b.id), reverse=True)
        return batches

    def of_jobs(self, job_ids: set[str], limit: int | None = None) -> builtins.list[Batch]:
        """The batch records of the jobs, newest first (at most `limit`); unreadable records are skipped."""
        batches = [b for b in self.records() if b.job_id in job_ids]
        return batches[:limit] if limit else batches

    def exists(self, batch_id: str) -> bool:
        return storage.filesystem(self.root, self.settings).exists(self._uri(batch_id))
