"""Where the service keeps what survives a restart (docs/serve.md, "Data dir"):

    DIR/catalogue.sqlite3                      files and batches (catalogue.py)
    DIR/files/<file-id>.jsonl                  uploaded batch input files
    DIR/batches/<batch-id>/output.jsonl        a batch's records (the job's output, manifest beside it)
    DIR/batches/<batch-id>/errors.jsonl        its failed lines' records

Every path is built from an id that passed object_ids.checked (or was made here), and every
path read back from the catalogue is resolved and checked to lie inside DIR before use.
"""
from __future__ import annotations

import os

from ...errors import LlamaBatchError
from . import object_ids

CATALOGUE = "catalogue.sqlite3"


class DataDirError(LlamaBatchError):
    """The data dir cannot be made or used (permissions, a file in the way)."""

    code = "data_dir"


def default_data_dir(environ: dict | os._Environ = os.environ) -> str:
    """$XDG_DATA_HOME/llamabatch/serve, else ~/.local/share/llamabatch/serve."""
    base = environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "llamabatch", "serve")


class DataDir:
    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        try:
            for folder in (self.root, self.files, self.batches):
                os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise DataDirError(f"cannot use the data dir {root}: {exc.strerror or exc}") from None
        self._sweep()

    @property
    def catalogue(self) -> str:
        return os.path.join(self.root, CATALOGUE)

    @property
    def files(self) -> str:
        return os.path.join(self.root, "files")

    @property
    def batches(self) -> str:
        return os.path.join(self.root, "batches")

    def upload_path(self, file_id: str) -> str:
        """Relative path of an upload's content."""
        return os.path.join("files", f"{_checked(file_id, object_ids.FILE)}.jsonl")

    def batch_folder(self, batch_id: str) -> str:
        """Relative path of a batch's folder (made when missing)."""
        rel = os.path.join("batches", _checked(batch_id, object_ids.BATCH))
        os.makedirs(self.absolute(rel), mode=0o700, exist_ok=True)
        return rel

    def absolute(self, rel: str) -> str:
        """DIR/rel, refused unless it lies inside DIR (a catalogue edited by hand cannot point out)."""
        full = os.path.realpath(os.path.join(self.root, rel))
        if os.path.commonpath([full, self.root]) != self.root:
            raise DataDirError(f"catalogue path {rel!r} is outside the data dir")
        return full

    def _sweep(self) -> None:
        """Remove uploads a crash left half written (never catalogued: nobody can name them)."""
        for name in os.listdir(self.files):
            if name.startswith(".") and name.endswith(".part"):
                try:
                    os.remove(os.path.join(self.files, name))
                except OSError:
                    pass


def _checked(value: str, prefix: str) -> str:
    good = object_ids.checked(value, prefix)
    if good is None:
        raise DataDirError(f"not an id: {object_ids.shown(value)}")
    return good
