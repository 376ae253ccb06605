"""Uploaded files: bytes under ``files/`` in the data directory, records in the store."""

from __future__ import annotations

from pathlib import Path

from nip_core.utils.fileio import atomic_write_bytes as atomic_write
from nipflow_llm_server.server.errors import ApiError, invalid_request, not_found
from nipflow_llm_server.server.records import FileRecord, new_id, now
from nipflow_llm_server.server.store import Store
from nipflow_llm_server.server.validation import TrainingFileError, parse_training_file

UPLOAD_PURPOSES = frozenset({"assistants", "batch", "fine-tune", "vision", "user_data", "evals"})


class FileService:
    """Create, read, list and delete files."""

    def __init__(self, store: Store, data_dir: Path):
        self.store = store
        self.data_dir = data_dir
        (data_dir / "files").mkdir(parents=True, exist_ok=True)

    def create(self, filename: str, purpose: str, content: bytes, *, file_id: str | None = None, check: bool = True) -> FileRecord:
        """Store a file; ``fine-tune`` uploads are validated line by line (400 on error)."""
        if check:
            if purpose not in UPLOAD_PURPOSES:
                raise invalid_request(
                    f"'{purpose}' is not one of {sorted(UPLOAD_PURPOSES)} - 'purpose'", param="purpose"
                )
            if purpose == "fine-tune":
                try:
                    parse_training_file(content)
                except TrainingFileError as exc:
                    raise invalid_request(
                        f"Invalid file format for Fine-Tuning API ({filename}): {exc}", param="file", code="invalid_file_format"
                    ) from None
        record = FileRecord(
            id=file_id or new_id("file-", 22), bytes=len(content), created_at=now(), filename=filename, purpose=purpose
        )
        rel = f"files/{record.id}"
        atomic_write(self.data_dir / rel, content)
        self.store.add_file(record, rel)
        return record

    def get(self, file_id: str) -> FileRecord:
        found = self.store.get_file(file_id)
        if found is None:
            raise not_found(f"No such File object: {file_id}", param="id")
        return found[0]

    def content(self, file_id: str) -> bytes:
        found = self.store.get_file(file_id)
        if found is None:
            raise not_found(f"No such File object: {file_id}", param="id")
        try:
            return (self.data_dir / found[1]).read_bytes()
        except FileNotFoundError:
            raise ApiError(500, f"content of file {file_id} is missing from the data directory", type="server_error") from None

    def delete(self, file_id: str) -> None:
        found = self.store.get_file(file_id)
        if found is None or not self.store.delete_file(file_id):
            raise not_found(f"No such File object: {file_id}", param="id")
        try:
            (self.data_dir / found[1]).unlink()
        except FileNotFoundError:
            pass
