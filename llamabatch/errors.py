"""Typed errors raised by the library. Only `llamabatch.cli` turns them into exit codes."""
from __future__ import annotations


class LlamaBatchError(Exception):
    """Base of every error llamabatch raises on purpose."""

    code = "error"


class InvalidRequest(LlamaBatchError, ValueError):
    """A request's prompt or parameters are wrong; other requests are unaffected."""

    code = "invalid_request"


class ContextOverflow(InvalidRequest):
    """The prompt (plus at least one generated token) does not fit in a slot's context."""

    code = "context_overflow"


class QueueFull(LlamaBatchError):
    """`max_queue` requests are already waiting; the caller may retry later."""

    code = "queue_full"


class ModelLoadError(LlamaBatchError):
    """The model file is missing, not GGUF, or llama.cpp cannot load it."""

    code = "model_load_error"


class DecodeError(LlamaBatchError):
    """llama_decode failed for a batch; only the requests in that batch fail."""

    code = "decode_error"


class InternalError(LlamaBatchError):
    """Something unexpected went wrong with one request (a bug): that request fails, nothing else."""

    code = "internal_error"


class EngineClosed(LlamaBatchError):
    """A request was submitted to an engine that has been closed."""

    code = "engine_closed"


class ResourceLimit(InvalidRequest):
    """A setting asks for more than this machine allows (memory for the KV cache and weights,
    threads): refused before anything is allocated (resources.py)."""

    code = "resource_limit"


class DeterminismUnavailable(InvalidRequest):
    """`deterministic=True` on a build where llamabatch cannot promise it (a GPU backend)."""

    code = "determinism_unavailable"


class JobFileError(LlamaBatchError):
    """A job's INPUT, OUTPUT or a file it keeps beside OUTPUT (error file, manifest, lock, retry
    journal, a table) cannot be used: one line naming the file; nothing else is wrong."""

    code = "file_error"


class ClusterStartError(LlamaBatchError):
    """The Ray engines of a job could not be started (no cluster, no resources): before any work."""

    code = "cluster_start_error"


class ConversationNotFound(LlamaBatchError):
    """A saved chat conversation asked for (by id, or the latest) is not in the conversation database."""

    code = "not_found"


class ReportFileError(LlamaBatchError):
    """A report file asked for (bench --json, --html) cannot be written: one line naming it."""

    code = "file_error"


class StreamUnusable(LlamaBatchError):
    """A stream a command serves over cannot be used as it needs (serve-stdin: file descriptors)."""

    code = "stream_unusable"
