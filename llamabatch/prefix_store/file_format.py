"""The bytes of one store entry, and their checks.

    magic (8 bytes) | format version (uint32 LE) | header length (uint32 LE)
    | header (JSON: fingerprint, n_tokens, payload_bytes, checksum)
    | tokens (n_tokens x uint32 LE) | payload (payload_bytes)

The checksum (CRC-32, named in the header so it can change) covers tokens and payload: it
catches a torn or bit-flipped file; the fingerprint in the header catches a file from another
model or llama.cpp that ended up in this folder. CRC-32 rather than a cryptographic hash: it is
checked on every restore (tens of MB), and it runs ~1.4x faster than SHA-256 even with SHA
instructions (several times faster without); nobody forges these files.
"""
from __future__ import annotations

import json
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import BinaryIO, Mapping, Sequence

MAGIC = b"LBPREFIX"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<8sII")  # magic, version, header length
_MAX_HEADER = 1 << 20  # a fingerprint is a few hundred bytes; anything larger is garbage


class BadEntry(Exception):
    """The file is not a usable entry of this store (the message says why)."""


@dataclass(frozen=True)
class Head:
    fingerprint: dict
    n_tokens: int
    payload_bytes: int
    checksum: str
    data_offset: int  # where the tokens start

    @property
    def file_size(self) -> int:
        return self.data_offset + 4 * self.n_tokens + self.payload_bytes


def tokens_to_le(tokens: Sequence[int]) -> bytes:
    """Token ids as uint32 little endian (ValueError/OverflowError for ids outside 0..2**32-1)."""
    try:
        return struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must be integers in 0..2**32-1: {exc}") from None


def tokens_from_le(data: bytes | memoryview) -> list[int]:
    ids = array("I")
    if ids.itemsize != 4:  # pragma: no cover - no platform we run on
        return list(struct.unpack(f"<{len(data) // 4}I", data))
    ids.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover
        ids.byteswap()
    return ids.tolist()


def checksum(tokens_le: bytes | memoryview, payload: bytes | memoryview) -> str:
    return "crc32:%08x" % zlib.crc32(payload, zlib.crc32(tokens_le))


def _head(fingerprint: Mapping[str, str], n_tokens: int, payload_bytes: int, crc: str) -> bytes:
    header = json.dumps(
        {"fingerprint": dict(fingerprint), "n_tokens": n_tokens, "payload_bytes": payload_bytes, "checksum": crc},
        sort_keys=True,
        separators=(",", ":"),
    ).encode("utf-8")
    return _FIXED.pack(MAGIC, FORMAT_VERSION, len(header)) + header


def encode_head(fingerprint: Mapping[str, str], tokens_le: bytes, payload: bytes | memoryview) -> bytes:
    """Everything before the tokens; the writer then writes tokens_le and payload as they are.
    Computes the checksum: tens of ms for a large payload, so the writer thread calls it."""
    return _head(fingerprint, len(tokens_le) // 4, len(payload), checksum(tokens_le, payload))


def entry_size(fingerprint: Mapping[str, str], n_tokens: int, payload_bytes: int) -> int:
    """The exact file size of an entry, without computing its checksum (fixed width)."""
    return len(_head(fingerprint, n_tokens, payload_bytes, checksum(b"", b""))) + 4 * n_tokens + payload_bytes


def _parse_head(fixed: bytes, read_header) -> Head:
    if len(fixed) < _FIXED.size:
        raise BadEntry("shorter than the fixed header")
    magic, version, header_len = _FIXED.unpack_from(fixed)
    if magic != MAGIC:
        raise BadEntry("not a prefix store entry (bad magic)")
    if version != FORMAT_VERSION:
        raise BadEntry(f"format version {version}, this llamabatch reads {FORMAT_VERSION}")
    if header_len > _MAX_HEADER:
        raise BadEntry(f"header of {header_len} bytes")
    raw = read_header(header_len)
    if len(raw) != header_len:
        raise BadEntry("truncated header")
    try:
        header = json.loads(raw.decode("utf-8"))
        head = Head(
            fingerprint=header["fingerprint"],
            n_tokens=header["n_tokens"],
            payload_bytes=header["payload_bytes"],
            checksum=header["checksum"],
            data_offset=_FIXED.size + header_len,
        )
    except (ValueError, KeyError, TypeError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadEntry(f"unreadable header: {exc}") from None
    if not isinstance(head.fingerprint, dict) or not isinstance(head.checksum, str):
        raise BadEntry("malformed header")
    for count in (head.n_tokens, head.payload_bytes):
        if type(count) is not int or count < 0:
            raise BadEntry("malformed header lengths")
    return head


def check_head(head: Head, fingerprint: Mapping[str, str], file_size: int) -> None:
    if head.fingerprint != dict(fingerprint):
        raise BadEntry("written for another fingerprint (model, llama.cpp or KV settings)")
    if head.file_size != file_size:
        raise BadEntry(f"{file_size} bytes on disk, the header says {head.file_size} (torn file)")


def read_head_and_tokens(f: BinaryIO, fingerprint: Mapping[str, str], file_size: int) -> tuple[Head, bytes]:
    """Header and token bytes of an entry file, without reading its payload (for the index)."""
    head = _parse_head(f.read(_FIXED.size), f.read)
    check_head(head, fingerprint, file_size)
    tokens_le = f.read(4 * head.n_tokens)
    if len(tokens_le) != 4 * head.n_tokens:
        raise BadEntry("truncated tokens")
    return head, tokens_le


def decode_entry(data: bytes | bytearray, fingerprint: Mapping[str, str]) -> tuple[memoryview, memoryview]:
    """(token bytes, payload) of a whole entry file, every check done; BadEntry otherwise."""
    view = memoryview(data)
    offset = _FIXED.size

    def read_header(n: int) -> bytes:
        return bytes(view[offset:offset + n])

    head = _parse_head(bytes(view[:offset]), read_header)
    check_head(head, fingerprint, len(data))
    tokens_end = head.data_offset + 4 * head.n_tokens
    tokens_le = view[head.data_offset:tokens_end]
    payload = view[tokens_end:]
    if checksum(tokens_le, payload) != head.checksum:
        raise BadEntry("checksum mismatch (corrupted file)")
    return tokens_le, payload
