"""The batch queue: every unfinished batch runs at once, each in a thread of its own as a job
of llamabatch.jobs (`start`, below) on the service's engine, which the running batches share
(batch_share.py); `max_running` (serve's --max-concurrent-batches) bounds how many run, the
oldest first, the rest waiting in the order they were created (1: one at a time, in order).

A batch's job writes its records beside a manifest, so a batch survives the server: at start
the queue picks up every batch the catalogue says is unfinished, and a batch that was
in_progress is resumed (resume=True on the same output), which runs exactly the lines that have
no record yet. The status follows the job: validating (queued) -> in_progress -> finalizing ->
completed; cancel -> cancelling (no line starts, lines in flight end) -> cancelled, with the
records written so far as its output and error files; past expires_at -> expired, the same way.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable

from ....errors import LlamaBatchError
from ....jobs import Done, LineFinished, SettingsChanged
from ..api_errors import bad_request
from .batch_files import BatchPaths, batch_paths, cut_torn_tail, register_outputs, whole_lines
from ..catalogue import Catalogue
from ..data_dir import DataDir
from .records import (CANCELLED, CANCELLING, COMPLETED, ENDED, EXPIRED, FAILED, FINALIZING, IN_PROGRESS,
                      UNFINISHED, VALIDATING, BatchRecord)

log = logging.getLogger("llamabatch.serve.http")

# start(batch_id, input, output, error_file, resume) -> a started job: a llamabatch.jobs.Job's
# cancel, next_event and wait, and close() once it has ended (its lane leaves the engine's share)
JobStart = Callable[[str, str, str, str, bool], Any]
COUNTS_EVERY_S = 0.5  # how often a running batch's request_counts reach the catalogue
POLL_S = 0.2  # how often the runner looks for cancel, expiry and shutdown while no event comes


class BatchQueue:
    def __init__(self, catalogue: Catalogue, data: DataDir, start: JobStart, clock: Callable[[], float] = time.time,
                 max_running: int | None = None):
        if max_running is not None and max_running < 1:
            raise ValueError(f"max_running must be at least 1 (None: no bound), got {max_running}")
        self.catalogue = catalogue
        self.data = data
        self.start_job = start
        self.clock = clock
        self.max_running = max_running
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._runners: dict[str, threading.Thread] = {}  # batch id -> the thread running it
        self._running: dict[str, Any] = {}  # batch id -> its job, once started
        self._thread = threading.Thread(target=self._loop, name="llamabatch-batches", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """A batch was created: look at the queue."""
        self._wake.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop: the running jobs' lines in flight are cancelled (no record; the next start
        resumes each batch), their files closed whole; queued batches stay queued."""
        self._closing.set()
        self._wake.set()
        with self._lock:
            jobs = list(self._running.values())
        for job in jobs:
            job.cancel(in_flight=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._thread.ident is not None:  # never started: the server failed before start()
            self._thread.join(timeout)
        with self._lock:
            runners = list(self._runners.values())  # none starts once the loop has ended
        for runner in runners:
            runner.join(None if deadline is None else max(deadline - time.monotonic(), 0))

    def cancel(self, batch_id: str) -> BatchRecord:
        """POST /v1/batches/{id}/cancel for a batch that exists."""
        now = int(self.clock())
        with self._lock:
            batch = self.catalogue.batch(batch_id)
            assert batch is not None
            if batch.status in ENDED or batch.status == CANCELLING:
                if batch.status in (CANCELLED, CANCELLING):
                    return batch
                raise bad_request(f"Cannot cancel a batch with status '{batch.status}'.", code="batch_not_cancellable")
            if batch.status == VALIDATING:  # not started: nothing to stop or to write
                self.catalogue.update_batch(batch_id, now, status=CANCELLING)
                self.catalogue.update_batch(batch_id, now, status=CANCELLED)
            else:
                self.catalogue.update_batch(batch_id, now, status=CANCELLING)
                job = self._running.get(batch_id)
                if job is not None:  # only this batch's job: the others run on
                    job.cancel()
        return self.catalogue.batch(batch_id)  # type: ignore[return-value]

    # -- the queue's thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closing.is_set():
            self._start_due()
            self._wake.wait(1.0)  # a batch created or ended sets it; the timeout only bounds a missed one
            self._wake.clear()

    def _start_due(self) -> None:
        """A thread for each unfinished batch not running yet, oldest first, up to max_running."""
        for batch in self.catalogue.batches_in(UNFINISHED):
            with self._lock:
                if self._closing.is_set():
                    return
                if batch.id in self._runners:
                    continue
                if self.max_running is not None and len(self._runners) >= self.max_running:
                    return
                runner = threading.Thread(target=self._run_one, args=(batch,), daemon=True,
                                          name=f"llamabatch-{batch.id}")
                self._runners[batch.id] = runner
            runner.start()

    def _run_one(self, batch: BatchRecord) -> None:
        try:
            self._run(batch)
        except Exception as exc:  # a bug must cost this batch, never the queue or the other batches
            log.exception("batch %s failed", batch.id)
            self._fail(batch.id, "internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                del self._runners[batch.id]
            self._wake.set()  # its place may go to a batch waiting for one

    def _run(self, batch: BatchRecord) -> None:
        if self._closing.is_set():  # the server stops before this batch's turn came: it keeps its status
            return
        input_file = self.catalogue.file(batch.input_file_id)
        if input_file is None:
            self._fail(batch.id, "input_file_missing", f"input file {batch.input_file_id} was deleted")
            return
        paths = batch_paths(self.data, batch, input_file.path)
        if batch.status == FINALIZING:  # the server stopped while finishing it: finish it again
            self._finish(batch, cancelled=bool(batch.times.get("cancelling_at")), expired=False, paths=paths)
            return
        if batch.status == CANCELLING:  # cancelled while no job ran it (a stop came between): no line starts
            for path in (paths.output, paths.errors):
                cut_torn_tail(path)
            self._finish(batch, cancelled=True, expired=False, paths=paths)
            return
        if not self._begin(batch.id):
            return
        resume = os.path.exists(paths.output)
        try:
            job = self.start_job(batch.id, paths.input, paths.output, paths.errors, resume)
        except SettingsChanged as exc:
            self._fail(batch.id, "settings_changed",
                       "cannot resume this batch: the server's settings differ from those it started with: "
                       + "; ".join(exc.changes) + "; restart the server with those settings, or with "
                       "--allow-changed-settings to finish it with the new ones", paths)
            return
        except LlamaBatchError as exc:
            self._fail(batch.id, exc.code, str(exc), paths)
            return
        with self._lock:
            self._running[batch.id] = job
            # a stop or a cancel that came while the job was starting stops it now
            if self._closing.is_set():
                job.cancel(in_flight=True)
            elif self.catalogue.batch(batch.id).status == CANCELLING:  # type: ignore[union-attr]
                job.cancel()
        try:
            expired = self._follow(batch, job, paths, resume)
            report = job.wait()
        finally:
            with self._lock:
                del self._running[batch.id]
            job.close()
        if self._closing.is_set():
            return  # stays in_progress (or cancelling): the next start resumes it
        if report.error is not None and not report.cancelled:
            self._fail(batch.id, "job_failed", report.error, paths)
            return
        cancelled = self.catalogue.batch(batch.id).status == CANCELLING  # type: ignore[union-attr]
        self._finish(batch, cancelled=cancelled, expired=expired, paths=paths)

    def _begin(self, batch_id: str) -> bool:
        """validating -> in_progress (under the lock: a cancel may be deciding meanwhile);
        False when the batch is not to run (cancelled while queued, or expired in the queue)."""
        with self._lock:
            batch = self.catalogue.batch(batch_id)
            if batch is None or batch.status in ENDED:
                return False
            if batch.status == VALIDATING:
                if self.clock() >= batch.expires_at:
                    self.catalogue.update_batch(batch_id, int(self.clock()), status=EXPIRED)
                    return False
                self.catalogue.update_batch(batch_id, int(self.clock()), status=IN_PROGRESS)
        return True

    def _follow(self, batch: BatchRecord, job: Any, paths: BatchPaths, resume: bool) -> bool:
        """Count the job's records into the catalogue until it ends; True when it expired."""
        ok = whole_lines(paths.output) if resume else 0
        failed = whole_lines(paths.errors) if resume else 0
        shown, expired, stopped = time.monotonic(), False, False
        while True:
            event = job.next_event(POLL_S)
            if isinstance(event, LineFinished):
                ok, failed = (ok + 1, failed) if event.ok else (ok, failed + 1)
            elif isinstance(event, Done) or (event is None and _ended(job)):
                break
            if not stopped and self._closing.is_set():
                job.cancel(in_flight=True)
                stopped = True
            if not stopped and self.clock() >= batch.expires_at:
                job.cancel()
                stopped = expired = True
            if time.monotonic() - shown >= COUNTS_EVERY_S:
                shown = time.monotonic()
                self.catalogue.update_batch(batch.id, completed=ok, failed=failed)
        return expired

    def _finish(self, batch: BatchRecord, *, cancelled: bool, expired: bool, paths: BatchPaths) -> None:
        now = int(self.clock())
        if self.catalogue.batch(batch.id).status != FINALIZING:  # type: ignore[union-attr]
            self.catalogue.update_batch(batch.id, now, status=FINALIZING)
        register_outputs(self.catalogue, self.catalogue.batch(batch.id), paths)  # type: ignore[arg-type]
        final = EXPIRED if expired else CANCELLED if cancelled else COMPLETED
        self.catalogue.update_batch(batch.id, int(self.clock()), status=final)

    def _fail(self, batch_id: str, code: str, message: str, paths: BatchPaths | None = None) -> None:
        """The batch ends failed; the records it has (`paths`) stay reachable as its output and
        error files, and the message names no path of the server's."""
        if paths is not None:
            for path in (paths.output, paths.errors):
                cut_torn_tail(path)
            register_outputs(self.catalogue, self.catalogue.batch(batch_id), paths)  # type: ignore[arg-type]
        self.catalogue.update_batch(batch_id, int(self.clock()), status=FAILED,
                                    errors=[{"code": code, "message": self._without_paths(message, paths),
                                             "param": None, "line": None}])

    def _without_paths(self, message: str, paths: BatchPaths | None) -> str:
        """A client sees file ids, never where the server keeps them."""
        names = [(paths.output, "the batch's output file"), (paths.errors, "the batch's error file"),
                 (paths.input, "the batch's input file")] if paths is not None else []
        for path, name in names + [(self.data.root, "the server's data dir")]:
            message = message.replace(path, name)
        return message


def _ended(job: Any) -> bool:
    """Whether the job's thread is over (it ended without a Done when it raised: wait() says what)."""
    try:
        job.wait(0)
    except TimeoutError:
        return False
    except Exception:
        return True
    return True
