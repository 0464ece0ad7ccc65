"""Read a GGUF file's key-value header without loading the model.

`llamabatch models` lists every GGUF it finds with its architecture, quantization,
context length and whether it carries a chat template; loading each model through
llama.cpp to learn that would take seconds and gigabytes per file. The header is a
short, documented section at the start of the file (GGUF v2 and v3; v1 is long gone):

    magic "GGUF" | version u32 | tensor count u64 | kv count u64 | kv pairs ...
    kv pair: key (u64 length + UTF-8) | value type u32 | value

Arrays with many entries (the tokenizer's vocabulary: 262,144 strings for Gemma 3) are
skipped, not decoded: `read_header` keeps them as an `Array` of type and length.
`check_gguf` is the cheap check made before any model loads: a regular file that starts with
the magic.
"""
from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

from ..errors import ModelLoadError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
# Arrays up to this length are decoded (stop-token lists and the like); longer ones are
# summarised, which keeps reading a header to a few milliseconds plus the vocabulary walk.
SMALL_ARRAY = 64

# value type -> (struct format, size); 8 (string) and 9 (array) are handled apart
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
            6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
STRING, ARRAY = 8, 9

# llama.cpp's llama_ftype (general.file_type) -> the quantization name people use
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


class GGUFError(ValueError):
    """Not a GGUF file we can read; the message is one line naming the cause."""


@dataclass(frozen=True)
class Array:
    """A long array left undecoded: its element type and length."""

    type: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # ggml's ne: dims[0] is the row length, dims[1] the number of rows
    ggml_type: int  # ggml_type: 2 Q4_0, 8 Q8_0, 12 Q4_K, 14 Q6_K, ...


@dataclass
class Header:
    version: int
    tensor_count: int
    metadata: dict[str, Any]
    end: int  # byte offset where the tensor infos start (for tools that rewrite headers)

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def context_length(self) -> int | None:
        value = self.metadata.get(f"{self.architecture}.context_length")
        return value if isinstance(value, int) else None

    @property
    def quantization(self) -> str | None:
        file_type = self.metadata.get("general.file_type")
        return FILE_TYPES.get(file_type, f"type {file_type}") if isinstance(file_type, int) else None

    @property
    def has_chat_template(self) -> bool:
        return bool(self.metadata.get("tokenizer.chat_template"))


class _Reader:
    def __init__(self, data: Any, path: str):
        self.data = data
        self.pos = 0
        self.path = path

    def take(self, fmt: str, size: int) -> Any:
        if self.pos + size > len(self.data):
            raise GGUFError(f"{self.path}: GGUF header is truncated at byte {self.pos}")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q", 8)
        if self.pos + n > len(self.data):
            raise GGUFError(f"{self.path}: GGUF header is truncated at byte {self.pos}")
        raw = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", "replace")

    def skip_string(self) -> None:
        n = self.take("<Q", 8)
        self.pos += n

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(*_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype = self.take("<I", 4)
            length = self.take("<Q", 8)
            if length <= SMALL_ARRAY:
                return [self.value(etype) for _ in range(length)]
            self.skip_array(etype, length)
            return Array(etype, length)
        raise GGUFError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")

    def skip_array(self, etype: int, length: int) -> None:
        if etype in _SCALARS:
            self.pos += _SCALARS[etype][1] * length
        elif etype == STRING:
            unpack, data = struct.unpack_from, self.data
            pos = self.pos
            for _ in range(length):
                pos += 8 + unpack("<Q", data, pos)[0]
            self.pos = pos
        else:  # arrays of arrays: rare, walk them
            for _ in range(length):
                self.value(etype)
        if self.pos > len(self.data):
            raise GGUFError(f"{self.path}: GGUF header is truncated (an array runs past the end)")


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words, for messages."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str):
    """Open `path` for reading only if it is a regular file; else GGUFError naming what it is.

    A FIFO named *.gguf would block open() until a writer comes, and reading a device may
    never end: stat first, then open with O_NONBLOCK (a FIFO swapped in after the stat still
    cannot block the open) and check the opened file again. OSError as open() raises it."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise GGUFError(f"{path}: is {file_kind(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise GGUFError(f"{path}: is {file_kind(mode)}, not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_gguf(path: str) -> None:
    """Raise ModelLoadError (one line: path and cause) unless `path` is a readable GGUF file."""
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory, not a GGUF file")
    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such model file")
    try:
        with open_regular(path) as f:  # a FIFO or device named *.gguf is refused, never opened blocking
            head = f.read(len(MAGIC))
    except GGUFError as exc:
        raise ModelLoadError(str(exc)) from None
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read model file ({exc.strerror or exc})") from None
    if head != MAGIC:
        found = f"starts with {head!r}" if head else "empty file"
        raise ModelLoadError(f"{path}: not a GGUF file ({found})")


def read_header(path: str) -> Header:
    """The key-value metadata of the GGUF at `path`. Raises GGUFError (one line) or OSError."""
    with open_regular(path) as f:
        magic = f.read(4)
        if magic != MAGIC:
            found = f"starts with {magic!r}" if magic else "empty file"
            raise GGUFError(f"{path}: not a GGUF file ({found})")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            reader = _Reader(data, path)
            reader.pos = 4
            version = reader.take("<I", 4)
            if version not in SUPPORTED_VERSIONS:
                raise GGUFError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")
            tensor_count = reader.take("<Q", 8)
            kv_count = reader.take("<Q", 8)
            metadata: dict[str, Any] = {}
            try:
                for _ in range(kv_count):
                    key = reader.string()
                    vtype = reader.take("<I", 4)
                    metadata[key] = reader.value(vtype)
            except struct.error:
                raise GGUFError(f"{path}: GGUF header is truncated at byte {reader.pos}") from None
            return Header(version, tensor_count, metadata, reader.pos)


def read_tensor_infos(path: str) -> list[TensorInfo]:
    """Each tensor's name, shape and ggml type (the infos after the key-value header), for
    choosing which weights to pin to a buffer type (cpu_buffers)."""
    header = read_header(path)
    with open_regular(path) as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        reader = _Reader(data, path)
        reader.pos = header.end
        out = []
        try:
            for _ in range(header.tensor_count):
                name = reader.string()
                n_dims = reader.take("<I", 4)
                dims = tuple(reader.take("<Q", 8) for _ in range(n_dims))
                ggml_type = reader.take("<I", 4)
                reader.take("<Q", 8)  # offset of the data
                out.append(TensorInfo(name, dims, ggml_type))
        except struct.error:
            raise GGUFError(f"{path}: GGUF tensor infos are truncated at byte {reader.pos}") from None
        return out
