"""Disk housekeeping over the whole store root (every fingerprint folder): the LRU size cap
and the tmp files that processes killed in the middle of a write left behind."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .naming import is_entry_file, is_fingerprint_folder, tmp_file_pid

log = logging.getLogger("llamabatch.prefix_store")


def _folders(root: Path):
    try:
        with os.scandir(root) as it:
            return [e.path for e in it if e.is_dir(follow_symlinks=False) and is_fingerprint_folder(e.name)]
    except OSError:
        return []


def _files(folder: str):
    try:
        with os.scandir(folder) as it:
            return [e for e in it if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def evict_lru(root: Path, max_bytes: int) -> list[str]:
    """Remove the least recently used entry files under root until they total <= max_bytes.

    Recency is the file's mtime (a load touches it). Returns the removed paths. Several
    processes may evict at once: a file another one removed first is simply skipped.
    """
    entries = []
    for folder in _folders(root):
        for entry in _files(folder):
            if is_entry_file(entry.name):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append((st.st_mtime_ns, entry.path, st.st_size))
    total = sum(size for _, _, size in entries)
    removed: list[str] = []
    for _, path, size in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # another process evicted it: it no longer counts either way
        except OSError as exc:
            log.debug("prefix store: cannot evict %s: %s", path, exc)
            continue
        total -= size
        removed.append(path)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a pid we can judge: leave the file alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else (EPERM)
    return True


def remove_dead_tmp_files(root: Path) -> list[str]:
    """Remove tmp files whose writing process is gone (killed in the middle of a save)."""
    removed: list[str] = []
    for folder in _folders(root):
        for entry in _files(folder):
            pid = tmp_file_pid(entry.name)
            if pid is None or pid == os.getpid() or _pid_alive(pid):
                continue
            try:
                os.unlink(entry.path)
                removed.append(entry.path)
            except OSError:
                pass
    if removed:
        log.debug("prefix store: removed %d tmp file(s) of dead writers", len(removed))
    return removed
