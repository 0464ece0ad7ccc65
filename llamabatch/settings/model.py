"""The one place a model setting becomes a file: `choose_model`.

The Resolved value carries the answer (the file, the name records use, a store's default
stops), so nothing downstream turns the model's spelling into a file again: one resolution,
one answer, whichever engine loads it.
"""
from __future__ import annotations

from typing import Mapping

from .resolved import Resolved


def choose_model(resolved: Resolved, aliases: Mapping[str, str] | None = None,
                 config_path: str | None = None) -> Resolved:
    """`resolved` with its model spelling turned into a checked GGUF file (aliases from the
    config file's [models] table, store names, folders, $LLAMABATCH_MODEL, the bundled one).

    The display name stays the user's spelling (or an explicit model_name); a store's
    default stops (Ollama's params layer) fill `stop` only where no layer set one, as Ollama
    does. Raises ModelLoadError (one line) for a name that matches nothing; whether the file
    is a readable GGUF is checked when it loads (loading.check_model), so a command checks its
    own files first. A value already resolved is returned as it is."""
    if resolved.model_resolved:
        return resolved
    from ..models.resolve import resolve_model_ref

    ref = resolve_model_ref(resolved.engine.model, dict(aliases or {}), config_path)
    out = resolved.replace(model=ref, engine=resolved.engine.replace(
        model=ref.path, model_name=resolved.engine.model_name or ref.name))
    if ref.stop and not out.sampling.stop and out.sources.get("stop", "default") == "default":
        out.sampling = out.sampling.replace(stop=list(ref.stop))
        out.sources["stop"] = f"model ({ref.source})"
    return out
