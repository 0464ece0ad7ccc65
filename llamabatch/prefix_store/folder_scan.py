"""The store's index kept in step with its fingerprint folder on disk: entries another process
wrote show up, and those it removed go, on the next lookup; a file that fails its checks is
deleted ("refused") and never indexed."""
from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from .file_format import BadEntry, read_head_and_tokens
from .index import PrefixIndex, sort_key_from_le
from .naming import entry_file, entry_key, is_entry_file

log = logging.getLogger("llamabatch.prefix_store")

# A folder whose mtime is this recent may change again within the same timestamp tick (coarse
# kernel clock, or 1-2 s on some file systems), so an unchanged mtime proves nothing yet: the
# index rescans the listing (cheap: no file is reopened that it already knows) until it is older.
_RACY_NS = 2_000_000_000


class FolderScan:
    def __init__(self, folder: Path, folder_name: str, fingerprint: dict, index: PrefixIndex,
                 lock: threading.RLock, on_refused: Callable[[], None]):
        self.folder, self.folder_name, self.fingerprint = folder, folder_name, fingerprint
        self.index, self.lock, self.on_refused = index, lock, on_refused
        self._seen: tuple[int, int, int] | None = None  # the folder's (mtime, inode, device) last scanned
        self._racy = False

    def check_name(self, tokens_le: bytes | memoryview, file_name: str) -> None:
        """An entry's name is a hash of its tokens: BadEntry when these do not give that name."""
        if entry_file(entry_key(self.folder_name, tokens_le)) != file_name:
            raise BadEntry("its tokens do not match its name")

    def refuse(self, name: str, path: Path, inode: int, why: str) -> None:
        """Delete a bad entry file (unless another process already replaced it) and forget it."""
        try:
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass
        with self.lock:
            self.index.remove(name)
            self.on_refused()
        log.debug("prefix store: refused and deleted %s: %s", name, why)

    def refresh(self) -> None:
        """Bring the index up to date with the folder if it changed (lock held)."""
        try:
            st = os.stat(self.folder)
        except OSError:
            for name in self.index.names():
                self.index.remove(name)
            self._seen = None
            return
        seen = (st.st_mtime_ns, st.st_ino, st.st_dev)
        if seen == self._seen and not self._racy:
            return
        self._racy = time.time_ns() - st.st_mtime_ns < _RACY_NS
        self._seen = seen
        try:
            with os.scandir(self.folder) as it:
                on_disk = {f"{self.folder_name}/{e.name}" for e in it
                           if is_entry_file(e.name) and e.is_file(follow_symlinks=False)}
        except OSError:
            return
        known = self.index.names()
        for name in known - on_disk:
            self.index.remove(name)
        for name in on_disk - known:
            self._index_file(name)

    def _index_file(self, name: str) -> None:
        file_name = name.partition("/")[2]
        path = self.folder / file_name
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                try:
                    head, tokens_le = read_head_and_tokens(f, self.fingerprint, st.st_size)
                    self.check_name(tokens_le, file_name)
                    if head.n_tokens == 0:
                        raise BadEntry("no tokens")
                except BadEntry as exc:
                    self.refuse(name, path, st.st_ino, str(exc))
                    return
        except OSError:
            return  # vanished (evicted) or unreadable: not indexed
        self.index.add(name, sort_key_from_le(tokens_le), st.st_size)
