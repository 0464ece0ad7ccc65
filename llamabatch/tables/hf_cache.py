"""`hf:datasets/OWNER/NAME[/CONFIG][:SPLIT]`: a Hugging Face dataset already in the local hub
cache, read from the Parquet files the hub stores. Nothing is ever downloaded.

The cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, laid out as
    datasets--OWNER--NAME/refs/main             the commit the cached snapshot is of
    datasets--OWNER--NAME/snapshots/<commit>/   the repository's files (links into blobs/)
A dataset's Parquet files sit in one of the hub's usual layouts:
    data/train-00000-of-00002.parquet           no config ("default")
    CONFIG/train-00000-of-00001.parquet         one folder per config
    CONFIG/train/0000.parquet                   the refs/convert/parquet branch
The split is the folder or the file-name word (train, test, validation, ...) a file carries.
Without a split, "train" is read if there is one, else the only split there is; without a
config, the default one (or the only one).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..files.whole_file import UnreadableFile, read_text
from .errors import TableError

REF_BYTES = 4096  # a ref file holds one commit hash

PREFIX = "hf:"
SPLIT_WORDS = ("train", "test", "validation", "valid", "dev", "eval", "evaluation")
DEFAULT_CONFIG_DIRS = ("data", "default")
_SPEC = re.compile(r"^hf:datasets/([^/:]+)/([^/:]+)(?:/([^/:]+))?(?::([^/:]+))?$")


@dataclass(frozen=True)
class HubSpec:
    owner: str
    name: str
    config: str | None
    split: str | None


def is_hf_spec(path: str) -> bool:
    return path.startswith(PREFIX)


def parse_spec(spec: str) -> HubSpec:
    m = _SPEC.match(spec)
    if not m:
        raise TableError(f"{spec!r} is not a Hugging Face dataset spec: write hf:datasets/OWNER/NAME[/CONFIG][:SPLIT]")
    return HubSpec(*m.groups())


def hub_cache_dir(environ: dict | None = None) -> str:
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return os.path.expanduser(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(env["HF_HOME"]), "hub")
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def _snapshots(repo: str) -> list[str]:
    """Snapshot folders to look in: the ones refs name (main first), then any others."""
    snaps = os.path.join(repo, "snapshots")
    order: list[str] = []
    refs = os.path.join(repo, "refs")
    named = []
    for root, _dirs, files in os.walk(refs):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), refs)
            named.append((rel != "main", rel, os.path.join(root, f)))
    for _not_main, _rel, path in sorted(named):
        try:
            commit = read_text(path, "hub ref", REF_BYTES).strip()  # a commit hash; a damaged ref is skipped
        except UnreadableFile:
            continue
        if commit and commit not in order and os.path.isdir(os.path.join(snaps, commit)):
            order.append(commit)
    try:
        order += sorted(d for d in os.listdir(snaps) if d not in order)
    except OSError:
        pass
    return [os.path.join(snaps, d) for d in order]


def _parquet_files(snapshot: str) -> list[str]:
    out = []
    for root, dirs, files in os.walk(snapshot):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out += [os.path.relpath(os.path.join(root, f), snapshot) for f in sorted(files) if f.endswith(".parquet")]
    return out


def _config_of(rel: str) -> str:
    parts = rel.split(os.sep)
    if len(parts) == 1 or parts[0] in DEFAULT_CONFIG_DIRS:
        return "default"
    return parts[0]


def _split_of(rel: str) -> str | None:
    parts = rel.split(os.sep)
    if len(parts) >= 3 and (parts[1] in SPLIT_WORDS or parts[0] not in DEFAULT_CONFIG_DIRS):
        return parts[1]  # CONFIG/SPLIT/0000.parquet (refs/convert/parquet), data/train/...
    stem = os.path.basename(rel)[: -len(".parquet")]
    sharded = re.fullmatch(r"(.+?)-\d{5}-of-\d{5}", stem)  # train-00000-of-00002: any split name
    if sharded:
        return sharded.group(1)
    for w in re.split(r"[-_.]", stem):  # imdb-train, train
        if w in SPLIT_WORDS:
            return w
    return None


def resolve(spec: str, environ: dict | None = None) -> tuple[list[str], str]:
    """The Parquet files of `spec` in the local cache (absolute paths, in order) and a readable
    name for messages. Raises TableError naming what there is when the spec matches nothing."""
    s = parse_spec(spec)
    hub = hub_cache_dir(environ)
    repo = os.path.join(hub, f"datasets--{s.owner}--{s.name}")
    if not os.path.isdir(repo):
        raise TableError(f"{s.owner}/{s.name} is not in the local Hugging Face cache ({hub}); llamabatch never "
                         f"downloads: fetch it first (huggingface-cli download --repo-type dataset {s.owner}/{s.name}) "
                         "or set HF_HUB_CACHE / HF_HOME")
    seen_any = False
    for snapshot in _snapshots(repo):
        files = _parquet_files(snapshot)
        if not files:
            continue
        seen_any = True
        chosen = _choose(files, s, spec)
        paths = [os.path.join(snapshot, rel) for rel in chosen]
        broken = [p for p in paths if not os.path.exists(p)]
        if broken:
            raise TableError(f"{spec}: {os.path.relpath(broken[0], snapshot)} is in the cache's snapshot but its "
                             "data is missing (an interrupted download?); download it again")
        return paths, spec
    if not seen_any:
        raise TableError(f"{s.owner}/{s.name} is in the local Hugging Face cache ({repo}) but holds no .parquet "
                         "files (llamabatch reads the Parquet files the hub stores, e.g. its refs/convert/parquet "
                         "branch)")
    raise TableError(f"{spec}: nothing matched")  # unreachable: _choose raises or returns files


def _choose(files: list[str], s: HubSpec, spec: str) -> list[str]:
    configs: dict[str, list[str]] = {}
    for rel in files:
        configs.setdefault(_config_of(rel), []).append(rel)
    if s.config is not None:
        if s.config not in configs:
            raise TableError(f"{spec}: no config {s.config!r} in the cache; configs there: {', '.join(sorted(configs))}")
        in_config = configs[s.config]
    elif len(configs) == 1:
        in_config = next(iter(configs.values()))
    elif "default" in configs:
        in_config = configs["default"]
    else:
        raise TableError(f"{spec}: the dataset has several configs; name one (hf:datasets/{s.owner}/{s.name}/CONFIG): "
                         f"{', '.join(sorted(configs))}")
    splits: dict[str | None, list[str]] = {}
    for rel in in_config:
        splits.setdefault(_split_of(rel), []).append(rel)
    named = sorted(k for k in splits if k is not None)
    if s.split is not None:
        if s.split not in splits:
            raise TableError(f"{spec}: no split {s.split!r} in the cache; splits there: "
                             f"{', '.join(named) if named else '(none named)'}")
        return splits[s.split]
    if not named:
        return in_config
    if "train" in splits:
        return splits["train"]
    if len(named) == 1 and None not in splits:
        return splits[named[0]]
    raise TableError(f"{spec}: the dataset has several splits; name one (…:SPLIT): {', '.join(named)}")
