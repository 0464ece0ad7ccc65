"""POST /v1/batches' body, checked as OpenAI checks it, into a new queued BatchRecord."""
from __future__ import annotations

from typing import Any

from ....openai_format import URLS
from ..api_errors import bad_request, not_found
from ..catalogue import Catalogue
from ..limits import COMPLETION_WINDOWS, MAX_METADATA_KEY, MAX_METADATA_PAIRS, MAX_METADATA_VALUE
from ..object_ids import BATCH, FILE, checked, new_id, shown
from .records import VALIDATING, BatchRecord

_KNOWN = ("input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after")


def new_batch(body: dict[str, Any], catalogue: Catalogue, now: int) -> BatchRecord:
    unknown = [k for k in body if k not in _KNOWN]
    if unknown:
        raise bad_request(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    endpoint = body.get("endpoint")
    if endpoint not in URLS:
        raise bad_request(f"endpoint must be one of {', '.join(URLS)}", param="endpoint")
    window = body.get("completion_window")
    if window not in COMPLETION_WINDOWS:
        raise bad_request(f"completion_window must be one of {', '.join(map(repr, COMPLETION_WINDOWS))}",
                          param="completion_window")
    metadata = _metadata(body.get("metadata"))
    raw_id = body.get("input_file_id")
    file_id = checked(raw_id, FILE)
    record = catalogue.file(file_id) if file_id else None
    if record is None:
        if not isinstance(raw_id, str):
            raise bad_request("input_file_id must be a string", param="input_file_id")
        raise not_found("file", shown(raw_id))
    if record.purpose != "batch":
        raise bad_request(f"file {file_id} has purpose '{record.purpose}'; a batch reads a file uploaded with "
                          "purpose 'batch'", param="input_file_id")
    others = [url for url in record.urls if url != endpoint]
    if others:
        raise bad_request(f"file {file_id} has lines for {', '.join(others)}; every line of a batch's input file "
                          f"must ask for its endpoint, {endpoint}", param="endpoint", code="mismatched_endpoint")
    return BatchRecord(new_id(BATCH), file_id, endpoint, window, VALIDATING, now, now + COMPLETION_WINDOWS[window],
                       metadata, total=record.lines)


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("metadata must be an object of strings", param="metadata")
    if len(value) > MAX_METADATA_PAIRS:
        raise bad_request(f"metadata holds at most {MAX_METADATA_PAIRS} pairs", param="metadata")
    for key, item in value.items():
        if len(key) > MAX_METADATA_KEY or not isinstance(item, str) or len(item) > MAX_METADATA_VALUE:
            raise bad_request(f"metadata keys are strings of at most {MAX_METADATA_KEY} characters and values "
                              f"strings of at most {MAX_METADATA_VALUE}", param="metadata")
    return dict(value)
