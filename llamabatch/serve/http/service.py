"""What the HTTP layer calls: files, batches and the online requests over one engine, with
everything that persists in the data dir. No HTTP here: app.py maps routes onto these methods,
and ApiError carries a refusal's status and message."""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable

from ...api import EngineAPI
from ...jobs import JobHost, start_job
from .api_errors import ApiError, bad_request, not_found
from .batches.batch_lane import BatchLane
from .batches.batch_queue import BatchQueue
from .batches.batch_share import BatchShare
from .batches.batch_requests import new_batch
from .catalogue import Catalogue
from .data_dir import DataDir
from .limits import DEFAULT_LIST_LIMIT, MAX_FILES_LIST_LIMIT, MAX_LIST_LIMIT, UploadLimits
from .object_ids import BATCH, FILE, checked, new_id, shown
from .online import Online
from .batches.records import UNFINISHED, BatchRecord, FileRecord
from .batches.upload_check import UploadCheck
from .batches.uploads import MultipartUpload


def batch_inflight(n_parallel: int, online_slots: int, reserved_slots: int = 0) -> int:
    """Lines of a batch in the engine at once: a line for each of the batch's slots and one
    queued behind each, so the engine admits a queued line in the tick a slot frees (not after
    a round trip through the lane and the supervised child's pipe). The batch's slots are all
    of them less the `online_slots` kept for online requests; the engine keeps those free of
    batch lines itself when it reserves them (`reserved_slots`, what `llamabatch serve
    --online-slots N` opens: N on top of --n-parallel). An engine that does not reserve them
    gets the batch's slots and no queue, so queued lines cannot take them. Online requests go
    ahead of queued batch lines by priority either way, putting one aside when every slot is
    busy (scheduling in docs/serve.md)."""
    if online_slots <= reserved_slots:
        return 2 * (n_parallel - online_slots)
    return max(0, n_parallel - online_slots)


class Service:
    def __init__(self, engine: EngineAPI, data_dir: str, *, online_slots: int = 0,
                 clock: Callable[[], float] = time.time, job_settings: dict[str, Any] | None = None,
                 upload_limits: UploadLimits = UploadLimits(), max_concurrent_batches: int | None = None):
        """`max_concurrent_batches`: how many batches run at once, sharing the engine (None: all
        that have not ended; 1: one at a time, in the order they were created)."""
        self.engine = engine
        self.upload_limits = upload_limits
        self.clock = clock
        self.data = DataDir(data_dir)
        self.catalogue = Catalogue(self.data.catalogue)
        self.online = Online(engine, on_end=self._online_ended)
        stats = engine.stats()
        self.n_parallel = stats.n_parallel
        self.online_slots = online_slots
        self.inflight = batch_inflight(self.n_parallel, online_slots, stats.reserved_slots)
        self.share = BatchShare(self.batch_slots)  # the batch places, handed to the running batches in turn
        self._lanes: dict[str, BatchLane] = {}  # batch id -> its lane, while its job runs
        self.job_settings = dict(job_settings or {})
        self.queue = BatchQueue(self.catalogue, self.data, self._start_job, clock, max_concurrent_batches)

    def start(self) -> None:
        self.queue.start()

    def close(self, timeout: float | None = None) -> None:
        self.queue.close(timeout)
        self.catalogue.close()

    def batch_slots(self) -> int:
        """Batch lines the engine may hold now (batch_inflight). An online request does not wait
        for one of them: it has a higher priority, and the engine puts a batch line aside for it
        (its KV kept) when every slot is busy."""
        return self.inflight

    def running_batch_lanes(self) -> dict[str, BatchLane]:
        """Every running batch's lane by its id (what /metrics reads each batch's tokens/s from)."""
        return dict(self._lanes)  # a copy: batches start and end in their own threads

    def _online_ended(self) -> None:
        self.share.feed()

    def _start_job(self, batch_id: str, input: str, output: str, errors: str, resume: bool) -> Any:
        # The job sees the engine through a lane (batch_lane.py), which decides when each line
        # reaches the engine, taking its turn at the places every running batch shares
        # (batch_share.py); the job keeps run's window of lines started ahead (4 per slot).
        # order="completion": OpenAI's output files are in no particular order, and records written
        # as lines finish make request_counts move at once and hold nothing back in memory.
        lane = BatchLane(self.engine, self.share)
        try:
            job = start_job(input, output, engine=lane, error_file=errors, resume=resume, input_format="jsonl",
                            order="completion", max_inflight=4 * self.n_parallel,
                            host=JobHost(argv=("llamabatch", "serve")), **self.job_settings)
        except BaseException:
            lane.close()
            raise
        self._lanes[batch_id] = lane
        return LaneJob(job, lane, lambda: self._lanes.pop(batch_id, None))

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    # -- files ----------------------------------------------------------------------------

    def new_upload(self, content_type: str | None) -> MultipartUpload:
        return MultipartUpload(content_type, self.data.files, UploadCheck(self.engine.default_params, self.upload_limits))

    def store_upload(self, upload: MultipartUpload) -> FileRecord:
        """Finish an upload fed to the end: check it, place it, catalogue it (or discard it)."""
        try:
            purpose, filename, check = upload.finish()
            if purpose != "batch":
                raise bad_request(f"purpose must be 'batch' (the files this service runs), got {purpose!r}",
                                  param="purpose")
            file_id = new_id(FILE)
            rel = self.data.upload_path(file_id)
            upload.place(self.data.absolute(rel))
        except BaseException:
            upload.discard()
            raise
        record = FileRecord(file_id, filename, "batch", check.bytes, int(self.clock()), rel, check.lines,
                            sorted(check.urls))
        self.catalogue.add_file(record)
        return record

    def file(self, raw_id: Any) -> FileRecord:
        file_id = checked(raw_id, FILE)
        record = self.catalogue.file(file_id) if file_id else None
        if record is None:
            raise not_found("file", shown(raw_id))
        return record

    def file_path(self, raw_id: Any) -> str:
        return self.data.absolute(self.file(raw_id).path)

    def files(self, *, after: Any, limit: Any, order: Any, purpose: Any) -> dict[str, Any]:
        n = _limit(limit, MAX_FILES_LIST_LIMIT, MAX_FILES_LIST_LIMIT)
        if order not in (None, "asc", "desc"):
            raise bad_request("order must be 'asc' or 'desc'", param="order")
        rows, more = self.catalogue.files(after=after, limit=n, ascending=order == "asc", purpose=purpose)
        return _page([r.to_api() for r in rows], more)

    def delete_file(self, raw_id: Any) -> dict[str, Any]:
        record = self.file(raw_id)
        readers = self.catalogue.batches_reading(record.id, UNFINISHED)
        if readers:
            raise bad_request(f"file {record.id} is the input of batch {readers[0]}, which has not ended; cancel it "
                              "first", code="file_in_use")
        path = self.data.absolute(record.path)
        self.catalogue.delete_file(record.id)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        return {"id": record.id, "object": "file", "deleted": True}

    # -- batches --------------------------------------------------------------------------

    def create_batch(self, body: dict[str, Any]) -> BatchRecord:
        record = new_batch(body, self.catalogue, int(self.clock()))
        self.catalogue.add_batch(record)
        self.queue.wake()
        return record

    def batch(self, raw_id: Any) -> BatchRecord:
        batch_id = checked(raw_id, BATCH)
        record = self.catalogue.batch(batch_id) if batch_id else None
        if record is None:
            raise not_found("batch", shown(raw_id))
        return record

    def batches(self, *, after: Any, limit: Any) -> dict[str, Any]:
        rows, more = self.catalogue.batches(after=after, limit=_limit(limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT))
        return _page([r.to_api() for r in rows], more)

    def cancel_batch(self, raw_id: Any) -> BatchRecord:
        return self.queue.cancel(self.batch(raw_id).id)


class LaneJob:
    """A batch's job with its lane: cancelling it also keeps the lines the lane holds from starting,
    and closing it (once the job has ended) takes the lane out of the share and of /metrics."""

    def __init__(self, job: Any, lane: BatchLane, on_close: Callable[[], Any] = lambda: None):
        self.job = job
        self.lane = lane
        self._on_close = on_close

    def close(self) -> None:
        self.lane.close()
        self._on_close()

    def cancel(self, *, in_flight: bool = False) -> None:
        self.job.cancel(in_flight=in_flight)
        self.lane.stop()

    def next_event(self, timeout: float | None = None) -> Any:
        return self.job.next_event(timeout)

    def wait(self, timeout: float | None = None) -> Any:
        return self.job.wait(timeout)


def _limit(value: Any, default: int, most: int) -> int:
    if value is None:
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= most:
        raise ApiError(400, f"limit must be an integer from 1 to {most}", param="limit")
    return n


def _page(data: list[dict[str, Any]], more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}
