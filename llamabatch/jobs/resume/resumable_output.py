"""A job's OUTPUT and what makes it resumable, around the batch loop: the OUTPUT sink, the lock
on OUTPUT, finishing a retry merge a kill left undone, the fingerprint check on resume, the
error file and the retry journal, the crash journal (crash_journal.py), and the manifest
(docs/long-jobs.md).

The job (job_opening.py) calls these in order: `prepare` (before INPUT is read and the model
loads), `open_files` (OUTPUT and the files beside it), `read_back` (with --resume), `begin`
(the model loaded), `routes` for the loop, then `end` (always, once the loop is over).
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, TextIO

from ...errors import InvalidRequest, JobFileError
from ...settings.resolved import Resolved
from .crash_journal import CrashJournal, journal_path as crash_journal_path
from ..writing.error_file import Routes, open_error_file
from ..writing.output_sink import Sink, open_output, read_back, stream_kind
from .fingerprint import changes, fingerprint
from .manifest import ManifestProblem, manifest_path, read_manifest, write_manifest
from ...files.model_digest import model_sha256
from ..writing.output_lock import OutputLock
from .retry_journal import RetryAnswered, journal_path, merge_journal, retryable_ids, whole_records
from . import manifest_fields
from .manifest_fields import not_in_input

OVERRIDE_FLAG = "--allow-changed-settings"


class ResumableOutput:
    def __init__(self, resolved: Resolved, input_path: str, output: str | None, *, error_file: str | None,
                 resume: bool, retry_failed: bool, allow_changed: bool, system: str | None,
                 argv: tuple[str, ...], tell: Callable[[str], None], table: dict[str, Any] | None = None):
        self.resolved = resolved
        self.input_path = input_path
        self.output = output
        self.error_file = error_file
        self.resume = resume
        self.retry_failed = retry_failed
        self.allow_changed = allow_changed
        self.system = system
        self.table = table  # a table INPUT's template and id column, for the fingerprint
        self.argv = argv
        self.tell = tell  # a line for people (the CLI shows it even with --quiet)
        # a manifest, lock and journal only beside a regular OUTPUT file (not stdout, not a pipe)
        self.on_file = output not in (None, "-") and stream_kind(output) is None
        self.lock = OutputLock(output) if self.on_file else None
        self.sink: Sink | None = None  # OUTPUT itself, once open_files opened it
        self.errors: Sink | None = None
        self.journal: Sink | None = None
        self.retry = None
        self.crashes: CrashJournal | None = None  # lines in flight if this process dies (crash_journal.py)
        self.retry_answered: RetryAnswered | None = None
        self.manifest: dict[str, Any] | None = None
        self.entry: dict[str, Any] | None = None
        self.changed: list[str] | None = None
        self.overridden: str | None = None

    # -- before the model loads ----------------------------------------------------------

    def prepare(self) -> None:
        """Lock OUTPUT, finish an interrupted merge, check the fingerprint. Raises InvalidRequest (a usage problem) or JobFileError."""
        if self.retry_failed and not self.resume:
            raise InvalidRequest("--retry-failed reruns failed lines of an earlier run: use it with --resume")
        if self.error_file is not None and not self.on_file:
            raise InvalidRequest("--error-file needs OUTPUT to be a regular file (-o FILE)")
        if self.lock is None:
            return
        try:
            self.lock.acquire()  # OutputLocked (a JobFileError) when another run holds it
        except OSError:
            # no folder, or one we may not write: opening OUTPUT says so in its own words next
            self.lock = None
            return
        if not self.resume:
            return
        try:
            merged = merge_journal(self.output, self.error_file)
        except OSError as exc:
            raise JobFileError(f"cannot finish the interrupted retry merge of {journal_path(self.output)}: "
                               f"{exc.strerror or exc}") from None
        if merged is not None:
            self.tell(f"finished an interrupted --retry-failed: {merged.replaced} record(s) "
                     f"replaced, {merged.appended} added")
        self._check_fingerprint()

    def _fingerprint(self) -> dict[str, Any]:
        return fingerprint(self.resolved, model_sha256(self.resolved.engine.model or ""), self.system, self.table)

    def _check_fingerprint(self) -> None:
        if not any(_has_records(p) for p in (self.output, self.error_file)):
            return  # nothing written yet (killed while the model loaded): nothing to mix, a new manifest
        path = manifest_path(self.output)
        now = self._fingerprint()
        try:
            self.manifest = read_manifest(path)
        except ManifestProblem as exc:
            if not self.allow_changed:
                raise InvalidRequest(f"cannot check the settings of this resume: {exc}; {OVERRIDE_FLAG} resumes "
                                     "anyway (and records that in a new manifest)") from None
            self.overridden = str(exc)
            self.manifest = None
            return
        changed = changes(self.manifest.get("fingerprint") or {}, now)
        if changed and not self.allow_changed:
            raise SettingsChanged(f"cannot resume: the settings differ from the run that wrote {self.output}: "
                                  + "; ".join(changed) + f" ({OVERRIDE_FLAG} resumes anyway and records the change)",
                                  changed)
        if changed:
            self.changed = changed

    def open_files(self, stdout: TextIO | None = None) -> Sink:
        """OUTPUT (`stdout` for none or "-"), the error file (checked before the model loads)
        and the crash journal; OUTPUT's sink. Raises JobFileError (`discard` undoes what opened)."""
        self.sink = open_output(self.output, self.input_path, stdout)
        if self.error_file is not None:
            self.errors = open_error_file(self.error_file, self.output, self.input_path)
        if self.lock is not None:  # OUTPUT is ours alone: so is its journal
            path = crash_journal_path(self.output)
            try:
                self.crashes = CrashJournal.open(path, resume=self.resume)
            except OSError as exc:
                raise JobFileError(f"cannot write {path}: {exc.strerror or exc}") from None
        return self.sink

    def read_back(self) -> tuple[Any, int]:
        """--resume: what OUTPUT and the error file answer; with --retry-failed less the
        retryable errors, and the journal opened for their new records."""
        answered, torn = read_back(self.sink)
        if self.errors is not None:
            answered, torn_e = read_back(self.errors, answered)
            torn += torn_e
        if self.retry_failed:
            self.retry = retryable_ids(self.output, self.error_file)
            self.journal = open_output(journal_path(self.output), self.input_path)
            self.journal.start_fresh()
            self.retry_answered = RetryAnswered(answered, self.retry)
            return self.retry_answered, torn
        return answered, torn

    def _start_fresh(self) -> None:
        """A run without --resume replaces OUTPUT: emptied, and the error file and a stale
        journal go too. Raises JobFileError."""
        self.sink.start_fresh()
        if self.errors is not None:
            self.errors.start_fresh()
        if self.on_file:
            try:
                os.remove(journal_path(self.output))
            except FileNotFoundError:
                pass

    def discard(self, *, keep_output: bool = False) -> None:
        """The run never started (the model failed to load): OUTPUT removed if this run made
        it, or with `keep_output` (emptied already) closed and kept."""
        if self.sink is not None:
            self.sink.close() if keep_output else self.sink.discard()
        for s in (self.errors, self.journal):
            if s is not None:
                s.discard()
        if self.crashes is not None:  # a fresh run leaves nothing; a resume keeps what it learnt
            self.crashes.close(complete=not self.resume)
        self.release()

    # -- the model loaded ---------------------------------------------------------------

    def begin(self, model_name: str) -> None:
        """OUTPUT replaced (a run without --resume) and the manifest's start written, before any
        record. Raises JobFileError when either cannot be written."""
        if not self.resume:
            self._start_fresh()
        if not self.on_file:
            return
        if self.manifest is None:
            model_path = self.resolved.engine.model
            self.manifest = manifest_fields.new_manifest(
                resolved=self.resolved, model=manifest_fields.model_facts(model_path, model_name,
                                                                     model_sha256(model_path or "")),
                input_path=self.input_path, output=self.output, error_file=self.error_file,
                fingerprint=self._fingerprint(), system=self.system)
        else:
            # the settings of this invocation from now on (a timeout may change freely; a change in the
            # fingerprint got here only with --allow-changed-settings, and the history says so)
            fresh = manifest_fields.new_manifest(
                resolved=self.resolved, model=self.manifest.get("model") or {}, input_path=self.input_path,
                output=self.output, error_file=self.error_file, fingerprint=self._fingerprint(), system=self.system)
            for key in manifest_fields.SETTINGS_KEYS:
                self.manifest[key] = fresh[key]
            if self.changed or self.overridden:
                model_path = self.resolved.engine.model
                self.manifest["model"] = manifest_fields.model_facts(model_path, model_name,
                                                                model_sha256(model_path or ""))
        event = "retry-failed" if self.retry_failed else "resume" if self.resume else "start"
        self.entry = manifest_fields.start_event(self.manifest, event, self.argv, self.changed, self.overridden)
        try:
            write_manifest(manifest_path(self.output), self.manifest)
        except OSError as exc:
            # no record is written without a manifest: a resume could not check what wrote them
            raise JobFileError(f"cannot write the manifest {manifest_path(self.output)}: {exc.strerror or exc}; "
                       "nothing was run") from None

    def routes(self) -> Routes | None:
        """Where each record goes when not all go to OUTPUT (--error-file, --retry-failed)."""
        if self.errors is None and self.journal is None:
            return None
        return Routes(self.sink, self.errors, self.journal, self.retry)

    # -- the loop is over --------------------------------------------------------------

    def end(self, *, complete: bool, wall_s: float, written: int, generated: int, ray: str | None,
            input_ids=None) -> None:
        """Close the extra files, merge the retry journal, write the manifest's end. `input_ids`:
        every INPUT line's id (INPUT read to the end), to report records that answer none."""
        for s in (self.errors, self.journal):
            if s is not None:
                s.close()
        if self.crashes is not None:
            self.crashes.close(complete=complete)
        if self.journal is not None:
            try:
                merged = merge_journal(self.output, self.error_file)
            except OSError as exc:
                self.tell(f"error: cannot merge the retried records: {exc.strerror or exc}; "
                         "they are kept in " + journal_path(self.output) + " and merged by the next --resume")
                merged = None
            if merged is not None:
                n = self.retry_count
                self.tell(f"retried {n} line(s); {merged.replaced} record(s) replaced in place")
        foreign = None
        if self.on_file and complete and input_ids is not None:
            foreign, shown = not_in_input(input_ids, self.output, self.error_file)
            if foreign:
                self.tell(f"{foreign} record(s) in {self.output} answer no INPUT line (ids "
                         + ", ".join(json.dumps(i) for i in shown) + (", ..." if foreign > len(shown) else "")
                         + "): kept as they are; a different INPUT?")
        if self.manifest is not None and self.entry is not None:
            self.manifest["not_in_input"] = foreign
            manifest_fields.finish(self.manifest, self.entry, status="finished" if complete else "stopped",
                              wall_s=wall_s, generated=generated, written=written, output=self.output,
                              error_file=self.error_file, input_path=self.input_path, ray=ray)
            self._write()

    @property
    def retry_count(self) -> int:
        return self.retry_answered.retried if self.retry_answered is not None else 0

    def _write(self) -> None:
        try:
            write_manifest(manifest_path(self.output), self.manifest)
        except OSError as exc:
            self.tell(f"cannot write the manifest {manifest_path(self.output)}: {exc.strerror or exc}")

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()


class SettingsChanged(InvalidRequest):
    """A resume whose settings differ from the run that wrote OUTPUT; `changes` lists them as
    "name: old → new", for a host that words the way out its own way (serve has no -o FILE)."""

    def __init__(self, message: str, changes: list[str]):
        super().__init__(message)
        self.changes = changes


def _has_records(path: str | None) -> bool:
    return bool(path) and next(whole_records(path), None) is not None
