"""PrefixStore: KV bytes of token prefixes kept on disk across processes.

Ties the parts together: names (naming), the entry file format and its checks (file_format),
the in-memory index of one fingerprint folder (index), atomic writes (atomic_write) on a
background thread (writer), and the LRU cap and dead tmp files (housekeeping). Pure Python
and stdlib only: what the payload bytes mean is the engine's business.

Thread safety: every public method may be called from any thread; the index and the counters
sit behind one lock, which is never held while a payload is read or written.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .atomic_write import write_atomically
from .file_format import (BadEntry, decode_entry, encode_head, entry_size, read_head_and_tokens, tokens_from_le,
                          tokens_to_le)
from .folder_scan import FolderScan
from .housekeeping import evict_lru, remove_dead_tmp_files
from .index import Match, PrefixIndex, sort_key, sort_key_from_le
from .other_kv import other_kv_entries, why_not_loaded
from .naming import canonical_fingerprint, entry_file, entry_key, fingerprint_folder, is_entry_file
from .writer import BackgroundWriter

log = logging.getLogger("llamabatch.prefix_store")

# Payload the queued writes may hold in memory: a few entries of a long conversation (tens of
# MB each), thousands of small ones. More is dropped, never waited for (see writer.py).
MAX_PENDING_BYTES = 256 << 20



@dataclass(frozen=True)
class StoreHit:
    name: str  # the entry's file name relative to the store root ("<fpdir>/<key>.kv")
    common: int  # tokens the looked-up prompt shares with the entry
    n_tokens: int  # tokens the entry holds


class PrefixStore:
    """Entries of (tokens, KV payload) under root/<fingerprint folder>/, LRU-capped at max_bytes.

    max_bytes caps every *.kv file under root (all fingerprints); 0 turns the store off:
    lookups miss, saves do nothing, nothing on disk is touched.
    """

    def __init__(self, root: str | os.PathLike, fingerprint: Mapping[str, str], max_bytes: int,
                 *, max_pending_bytes: int = MAX_PENDING_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0 = off), got {max_bytes}")
        if max_pending_bytes < 1:
            raise ValueError(f"max_pending_bytes must be >= 1, got {max_pending_bytes}")
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        # As it reads back from a header (JSON round trip), so the comparison is like for like.
        self._fingerprint = json.loads(canonical_fingerprint(fingerprint))
        self._folder_name = fingerprint_folder(fingerprint)
        self._folder = self.root / self._folder_name
        self._lock = threading.RLock()
        self._index = PrefixIndex()
        self._queued: set[str] = set()  # names queued or being written by this store
        self._unwanted: set[str] = set()  # of those, removed before their write ended: never kept
        self._counts = {"saved": 0, "loaded": 0, "refused": 0, "dropped": 0}
        self._scan = FolderScan(self._folder, self._folder_name, self._fingerprint, self._index, self._lock,
                                on_refused=lambda: self._counts.update(refused=self._counts["refused"] + 1))
        self._writer = BackgroundWriter(max_pending_bytes)
        self._closed = False
        if self.enabled:
            remove_dead_tmp_files(self.root)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    # -- lookups ----------------------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], min_common: int = 1) -> StoreHit | None:
        """The entry sharing the longest prefix with `tokens` (at least min_common tokens)."""
        return self._ask(tokens, lambda query: self._index.longest(query, min_common))

    def longest_starting(self, tokens: Sequence[int], min_tokens: int = 1) -> StoreHit | None:
        """The longest entry whose whole token list starts `tokens` (at least min_tokens of them):
        what a caller that can only continue an entry from its end may restore."""
        return self._ask(tokens, lambda query: self._index.longest_starting(query, min_tokens))

    def _ask(self, tokens: Sequence[int], find: Callable[[bytes], Match | None]) -> StoreHit | None:
        if not self.enabled or len(tokens) == 0:
            return None
        query = sort_key(tokens)
        with self._lock:
            self._scan.refresh()
            match = find(query)
        return StoreHit(match.name, match.common, match.n_tokens) if match else None

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry of exactly these tokens exists (or is being written by this store)."""
        if not self.enabled or len(tokens) == 0:
            return False
        _, name = self._name_of(tokens_to_le(tokens))
        with self._lock:
            self._scan.refresh()
            return name in self._index or name in self._queued

    def _name_of(self, tokens_le: bytes) -> tuple[str, str]:
        """(key, entry name under the root) of the entry holding these tokens."""
        key = entry_key(self._folder_name, tokens_le)
        return key, f"{self._folder_name}/{entry_file(key)}"

    def covered(self, tokens: Sequence[int]) -> int:
        """The longest prefix of `tokens` some entry already holds (0 = none)."""
        hit = self.lookup(tokens, 1)
        return hit.common if hit else 0

    def load(self, hit: StoreHit) -> tuple[list[int], memoryview | bytes] | None:
        """(the entry's tokens, its KV payload as a writable memoryview), every check passed;
        None otherwise (a bad file is deleted). Never raises. Marks the entry as just used."""
        path = self._own_entry(hit.name)
        if path is None:
            if self.enabled:
                log.debug("prefix store: %s is not an entry of this store's fingerprint", hit.name)
            return None
        try:
            with open(path, "rb", buffering=0) as f:
                st = os.fstat(f.fileno())
                inode = st.st_ino
                # Into a bytearray: the payload comes back as a writable view, so the caller can
                # hand it to ctypes (from_buffer) without another copy of tens of MB.
                data = bytearray(st.st_size)
                got = f.readinto(data) if st.st_size else 0
                try:
                    if got != st.st_size:
                        raise BadEntry(f"read {got} of {st.st_size} bytes")
                    tokens_le, payload = decode_entry(data, self._fingerprint)
                    self._scan.check_name(tokens_le, path.name)
                except BadEntry as exc:
                    self._scan.refuse(hit.name, path, inode, str(exc))
                    return None
                try:
                    os.utime(f.fileno() if os.utime in os.supports_fd else path)
                except OSError:
                    pass  # read-only store: still usable, just not LRU-refreshed
        except FileNotFoundError:  # evicted, maybe by another process, since the lookup
            with self._lock:
                self._index.remove(hit.name)
            return None
        except OSError as exc:
            log.debug("prefix store: cannot read %s: %s", hit.name, exc)
            return None
        with self._lock:
            self._counts["loaded"] += 1
        return tokens_from_le(tokens_le), payload

    def tokens_of(self, name: str) -> list[int] | None:
        """The token ids entry `name` holds, from its header (the payload is not read); None
        when it is not an entry of this store's fingerprint, is gone, or fails the header checks.
        (A chat resumes from exactly the tokens its last turn's entry holds.)"""
        path = self._own_entry(name)
        if path is None:
            return None
        try:
            with open(path, "rb") as f:
                _, tokens_le = read_head_and_tokens(f, self._fingerprint, os.fstat(f.fileno()).st_size)
            self._scan.check_name(tokens_le, path.name)
        except (OSError, BadEntry):
            return None  # a bad file is refused (and deleted) by the index or by load, not here
        return tokens_from_le(tokens_le)

    def remove(self, name: str) -> bool:
        """Delete entry `name` now: for a caller that knows it is no longer wanted (a chat's
        older turns). Only ever an entry file of this store's fingerprint folder; never raises.
        True when a file was deleted. An entry still queued is not written (or deleted once
        written): a chat typed faster than the disk writes may drop a turn that is not yet on it."""
        path = self._own_entry(name)
        if path is None:
            return False
        with self._lock:
            if name in self._queued:
                self._unwanted.add(name)
        try:
            os.unlink(path)
            removed = True
        except OSError:
            removed = False
        with self._lock:
            self._index.remove(name)
        return removed

    def other_kv_note(self) -> str | None:
        """One line when this root holds entries of the same model saved with other KV cache
        types or V layout (other_kv.py): they are never loaded here, and the user should know why."""
        return other_kv_entries(self.root, self._fingerprint, self._folder_name) if self.enabled else None

    def why_not_loaded(self, name: str) -> str | None:
        """One line when entry `name` exists but belongs to other KV settings; else None."""
        return why_not_loaded(name, self.root, self._fingerprint) if self.enabled else None

    def _own_entry(self, name: str) -> Path | None:
        folder, _, file_name = name.partition("/")
        if not self.enabled or folder != self._folder_name or not is_entry_file(file_name):
            return None
        return self._folder / file_name

    # -- saving -----------------------------------------------------------------------------

    def save(self, tokens: Sequence[int], payload: bytes | bytearray | memoryview, *,
             owned: bool = False) -> str | None:
        """Queue a write of (tokens, payload) and return the entry's name at once; None when not
        queued (store off or closed, entry larger than max_bytes, an entry with these tokens
        exists, or the writes already pending hold max_pending_bytes). Never blocks on the disk.

        A bytes payload (or a read-only view of one) is kept as is; any other buffer is copied
        here (tens of ms for tens of MB), so the caller may reuse it as soon as save returns;
        owned=True skips that copy: the caller hands the buffer over and never writes to it again."""
        if not self.enabled or self._closed or len(tokens) == 0:
            return None
        tokens_le = tokens_to_le(tokens)
        key, name = self._name_of(tokens_le)
        view = memoryview(payload).cast("B")
        with self._lock:
            self._scan.refresh()
            if name in self._index or name in self._queued:
                return None
            if entry_size(self._fingerprint, len(tokens), len(view)) > self.max_bytes:
                self._drop(name, "larger than the store's max_bytes")
                return None
            if not self._writer.has_room(len(view)):
                self._drop(name, "writer busy (max_pending_bytes pending)")
                return None
            self._queued.add(name)
        if not owned and not (view.readonly and isinstance(view.obj, bytes)):
            view = memoryview(bytes(view))  # the caller's buffer may change once we return
        if not self._writer.submit(lambda: self._write(name, key, tokens_le, view), len(view)):
            with self._lock:
                self._queued.discard(name)
                self._drop(name, "writer busy (max_pending_bytes pending)")
            return None
        return name

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for queued writes; True when all are done."""
        return self._writer.flush(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Let queued writes finish for at most `timeout` seconds, then stop the writer.
        Writes still queued then are dropped; a hung one is abandoned to its daemon thread."""
        self._closed = True
        dropped = self._writer.close(timeout)
        with self._lock:
            self._counts["dropped"] += dropped

    def __enter__(self) -> PrefixStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def stats(self) -> dict:
        """entries and bytes (this fingerprint's folder), and this store's counts: saved, loaded,
        refused (torn/foreign/corrupt files deleted), dropped (saves not written), pending."""
        with self._lock:
            if self.enabled:
                self._scan.refresh()
            return {"entries": len(self._index), "bytes": self._index.total_bytes(), **self._counts,
                    "pending": self._writer.pending}

    # -- internals --------------------------------------------------------------------------

    def _write(self, name: str, key: str, tokens_le: bytes, payload: memoryview) -> None:
        """On the writer thread: write the entry, index it, then enforce the LRU cap."""
        try:
            with self._lock:
                if name in self._unwanted:
                    return
            head = encode_head(self._fingerprint, tokens_le, payload)
            path = write_atomically(self._folder, key, (head, tokens_le, payload))
        except OSError as exc:  # disk full, read-only, permissions: the save is dropped
            with self._lock:
                self._drop(name, str(exc))
            return
        else:
            with self._lock:
                if name in self._unwanted:  # removed while it was being written
                    path.unlink(missing_ok=True)
                    return
                self._index.add(name, sort_key_from_le(tokens_le), len(head) + len(tokens_le) + len(payload))
                self._counts["saved"] += 1
        finally:
            with self._lock:
                self._queued.discard(name)
                self._unwanted.discard(name)
        evicted = evict_lru(self.root, self.max_bytes)
        if evicted:
            with self._lock:
                for path in evicted:
                    self._index.remove(f"{Path(path).parent.name}/{Path(path).name}")
            log.debug("prefix store: evicted %d least recently used entr%s", len(evicted),
                      "y" if len(evicted) == 1 else "ies")

    def _drop(self, name: str, why: str) -> None:
        self._counts["dropped"] += 1
        log.debug("prefix store: save of %s dropped: %s", name, why)
