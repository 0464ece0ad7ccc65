"""The catalogue's two kinds of object, and how each looks in OpenAI's API (the File and Batch
objects the SDK parses)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Batch statuses, as OpenAI names them
VALIDATING, IN_PROGRESS, FINALIZING, COMPLETED = "validating", "in_progress", "finalizing", "completed"
FAILED, EXPIRED, CANCELLING, CANCELLED = "failed", "expired", "cancelling", "cancelled"
ENDED = (COMPLETED, FAILED, EXPIRED, CANCELLED)  # no further change
UNFINISHED = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)  # the batch queue owes them an end
# the timestamp field each status sets when it is reached
STATUS_TIMES = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at", COMPLETED: "completed_at",
                FAILED: "failed_at", EXPIRED: "expired_at", CANCELLING: "cancelling_at", CANCELLED: "cancelled_at"}


@dataclass
class FileRecord:
    id: str
    filename: str
    purpose: str  # "batch" (uploads), "batch_output" (a batch's output and error files)
    bytes: int
    created_at: int
    path: str  # relative to the data dir; built from the id, never from the caller's filename
    lines: int = 0  # non-blank lines (uploads)
    urls: list[str] = field(default_factory=list)  # the endpoints its lines ask for (uploads)

    def to_api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None, "expires_at": None}


@dataclass
class BatchRecord:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    metadata: dict[str, str] | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None  # why the batch failed as a whole (OpenAI's errors.data)
    times: dict[str, int] = field(default_factory=dict)  # in_progress_at, completed_at, ... as reached

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "input_file_id": self.input_file_id,
            "completion_window": self.completion_window, "status": self.status,
            "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
            "created_at": self.created_at, "expires_at": self.expires_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
            "errors": None if not self.errors else {"object": "list", "data": self.errors},
        }
        for name in STATUS_TIMES.values():
            out[name] = self.times.get(name)
        return out


def dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
