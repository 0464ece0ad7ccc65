"""Grammars as token masks: llguidance computes, per step, the set of tokens a grammar allows
as a bitmask (tens of microseconds), which is applied to the logits row in place before the
request's own chain samples from it.

llama.cpp's GBNF sampler instead walks its grammar stacks over every candidate of the
vocabulary at each step (262,144 of them for Gemma 3): milliseconds a token, which made
JSON-schema lines run at a quarter of the speed of plain ones. llguidance was
chosen by measurement (docs/structured-output.md): a 3 MB abi3 wheel with no required
dependencies; xgrammar, the other mask library the fast servers use, requires torch,
transformers and triton, gigabytes a CPU tool should not carry for a mask.

One MaskGrammars per model vocabulary: its llguidance tokenizer is built once, on first need
(~1.8 s for Gemma 3's vocabulary, ~0.3 s for SmolLM2's), and each grammar text is compiled
once into a template matcher (an LRU of COMPILED_KEPT); a request gets a deep copy. Both
happen at submit time, on the submitting thread, never on the engine's.

Backends (EngineConfig.grammar_backend, --grammar-backend, LLAMABATCH_GRAMMAR_BACKEND):
  auto        json_schema through llguidance (an error names what it cannot honour); GBNF
              grammars through llguidance where its converter takes them, else llama.cpp's
  llguidance  as auto, but a GBNF grammar llguidance cannot take is the request's error
  llama       llama.cpp's GBNF sampler for everything (json_schema via its converter)
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ...config import GRAMMAR_BACKENDS
from ...errors import InvalidRequest
from ...constraints.gbnf_guard import size_problem
from ...constraints.schema_prepare import prepared_schema_text
from ...constraints.tool_grammar import LarkGrammar

BACKENDS = GRAMMAR_BACKENDS  # what EngineConfig.grammar_backend may hold
BACKEND_ENV = "LLAMABATCH_GRAMMAR_BACKEND"
COMPILED_KEPT = 256  # compiled grammars kept per model (a file's lines mostly share a few schemas)
# Keys and items separated as people write JSON (and as llama.cpp's converter allows), with no
# other whitespace: the separators are then forced text, evaluated without sampling, at prefill speed.
JSON_OPTIONS = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}


def chosen_backend(value: str | None) -> str:
    """The backend a setting means: its value, else $LLAMABATCH_GRAMMAR_BACKEND, else auto."""
    value = value or os.environ.get(BACKEND_ENV, "").strip() or "auto"
    if value not in BACKENDS:
        raise InvalidRequest(f"grammar_backend must be one of {', '.join(BACKENDS)}, got {value!r}")
    return value


def available() -> bool:
    try:
        import llguidance  # noqa: F401
    except ImportError:
        return False
    return True


def _one_line(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= 300 else line[:297] + "..."


class MaskGrammars:
    """llguidance matchers for one model's vocabulary (`vocab`: llama/vocab.Vocabulary)."""

    def __init__(self, vocab: Any, backend: str = "auto"):
        self.vocab = vocab
        self.backend = backend
        self.n_vocab = vocab.n_tokens
        self._tokenizer = None
        self._tokenizer_lock = threading.Lock()
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._compiled_lock = threading.Lock()

    # -- which backend a request gets ------------------------------------------------------

    def matcher_for(self, grammar: str | None, json_schema: Any) -> "Matcher | None":
        """A fresh Matcher for the request's grammar, or None where llama.cpp's sampler takes
        it (backend llama, or auto with a GBNF grammar llguidance cannot read). Raises
        InvalidRequest (one line) for a grammar or schema that is wrong or asks what cannot be
        honoured."""
        if self.backend == "llama" or (not grammar and json_schema is None):
            return None
        if json_schema is not None:
            text = prepared_schema_text(json_schema)  # closed to its listed properties, checked
            _check_size("json_schema", text)
            key = "json_schema\0" + text
            lark = None
        elif isinstance(grammar, LarkGrammar):  # a tool call's grammar (constraints/tool_grammar.py)
            _check_size("tool call grammar", grammar)
            key, lark = "lark\0" + grammar, str(grammar)
        else:
            _check_size("grammar", grammar)
            key = "gbnf\0" + grammar
            lark = self._lark(grammar)
            if lark is None:
                return None
        try:
            template = self._compile(key, text if json_schema is not None else None, lark)
        except InvalidRequest:
            if json_schema is None and self.backend == "auto" and not isinstance(grammar, LarkGrammar):
                return None  # a GBNF grammar llguidance reads but cannot use: llama.cpp's sampler decides
            raise
        return Matcher(template.deep_copy(), self.n_vocab, self.vocab.eog_ids[0] if self.vocab.eog_ids else None)

    def _lark(self, grammar: str) -> str | None:
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            return gbnf_to_lark(grammar)
        except Exception as exc:  # the converter raises its own and plain errors for what it cannot take
            if self.backend == "llguidance":
                raise InvalidRequest(f"grammar cannot be read by llguidance: {_one_line(exc)} "
                                     f"(--grammar-backend llama uses llama.cpp's sampler)") from None
            return None  # auto: llama.cpp's own GBNF parser takes it (and reports what is wrong)

    def _compile(self, key: str, schema: str | None, lark: str | None) -> Any:
        with self._compiled_lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                if isinstance(template, str):  # compiled once, refused once: every line says so at once
                    raise InvalidRequest(template)
                return template
        try:
            template = self._compile_new(schema, lark)
        except InvalidRequest as exc:
            template = str(exc)  # the message, not the exception: its traceback would grow each raise
        with self._compiled_lock:
            self._compiled[key] = template
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        if isinstance(template, str):
            raise InvalidRequest(template)
        return template

    def _compile_new(self, schema: str | None, lark: str | None) -> Any:
        import llguidance

        what = "json_schema" if schema is not None else "grammar"
        try:
            grammar = (llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
                       if schema is not None else llguidance.LLMatcher.grammar_from_lark(lark))
        except ValueError as exc:
            raise InvalidRequest(f"{what} is not valid: {_one_line(exc)}") from None
        # Compiling drops the GIL; llguidance's limits (grammar size, lexer fuel, items per
        # row) bound its time and memory, and a grammar past them is an error here.
        template = llguidance.LLMatcher(self.tokenizer(), grammar, log_level=0)
        if template.is_error():
            raise InvalidRequest(f"{what} cannot be used: {_one_line(template.get_error())}")
        return template

    def tokenizer(self) -> Any:
        """llguidance's view of the vocabulary, built once (every end-of-generation token counts
        as its EOS: a finished grammar allows each of them)."""
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = _tokenizer_of(self.vocab)
            return self._tokenizer


def _tokenizer_of(vocab: Any) -> Any:
    """llguidance.llamacpp.lltokenizer_from_vocab, through llama_vocab_get_attr (its
    llama_token_get_attr is deprecated in this llama-cpp-python, and warns 262,144 times)."""
    import ctypes

    from llama_cpp import llama_cpp as C
    from llguidance import LLTokenizer

    size = 16 * 1024
    buf = ctypes.create_string_buffer(size)
    control, user = C.LLAMA_TOKEN_ATTR_CONTROL, C.LLAMA_TOKEN_ATTR_USER_DEFINED
    # the C functions themselves: the wrappers' checks cost more than the calls, 262,144 times
    to_piece, get_attr, ptr = C._lib.llama_token_to_piece, C._lib.llama_vocab_get_attr, vocab.ptr
    pieces: list[bytes] = []
    for token in range(vocab.n_tokens):
        n = to_piece(ptr, token, buf, size, 0, True)
        piece = ctypes.string_at(buf, n) if n > 0 else b""
        attr = get_attr(ptr, token)
        # llguidance marks special tokens with a leading 0xff: they match only as themselves
        if attr & control or (attr & user and piece.startswith(b"<") and piece.endswith(b">")):
            piece = b"\xff" + piece
        pieces.append(piece)
    tokenize = ctypes.cast(C._lib.llama_tokenize, ctypes.c_void_p).value
    return LLTokenizer.from_llamacpp(tokens=pieces, vocab_ptr=vocab.ptr, tokenize_fptr=tokenize,
                                     eos_token=list(vocab.eog_ids) or C.llama_vocab_eos(vocab.ptr), slices=None)


def _check_size(what: str, text: str) -> None:
    """The one size bound of constraints.gbnf_guard, which every backend applies."""
    if (problem := size_problem(what, text)) is not None:
        raise InvalidRequest(problem)


_BIT = np.arange(32, dtype=np.int64)  # a bit's place in its 32-bit word (little-endian bit order)


class Matcher:
    """One request's grammar state: the mask of the next step, applied to a logits row in
    place, and the tokens accepted so far."""

    def __init__(self, matcher: Any, n_vocab: int, end_token: int | None = None):
        self.matcher = matcher
        self.n_vocab = n_vocab
        self.end_token = end_token  # an end-of-generation token: what a finished grammar allows
        self.words = np.full((n_vocab + 31) // 32, -1, dtype=np.int32)  # one bit a token

    def mask_row(self, logits: np.ndarray) -> None:
        """Set the logits of every token the grammar forbids to -inf, in place."""
        self.matcher.unsafe_compute_mask_ptr(self.words.ctypes.data, self.words.nbytes)
        self._check()
        # The allowed tokens from the words that hold any (a JSON step allows a few hundred of
        # 262,144): unpacking and scanning every bit took ~0.4 ms a row on Gemma 3, this ~0.04.
        full = np.flatnonzero(self.words)
        if len(full) * 4 < len(self.words):  # few allowed (the usual case): keep those, clear the rest
            bits = np.unpackbits(self.words[full].view(np.uint8), bitorder="little").reshape(-1, 32)
            allowed = (full[:, None] * 32 + _BIT)[bits.astype(bool)]
            allowed = allowed[allowed < self.n_vocab]
            kept = logits[allowed]
            logits.fill(-np.inf)
            logits[allowed] = kept
        else:
            bits = np.unpackbits(self.words.view(np.uint8), count=self.n_vocab, bitorder="little")
            logits[bits == 0] = -np.inf

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)
        self._check()

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order, the grammar would accept from here (nothing is
        consumed): speculative decoding cuts a guess at the first token the mask forbids."""
        if not tokens:
            return 0
        n = self.matcher.validate_tokens(tokens)
        self._check()
        return int(n)

    def forced(self, may_end: bool = True) -> list[int]:
        """The tokens the grammar allows as the only continuation now (keys, quotes, braces,
        separators), consumed: they go into the sequence without being sampled. With `may_end`,
        a grammar that allows nothing but the end adds an end-of-generation token, so the answer
        ends now rather than after a tick that could only sample that token (every EOG token
        ends an answer alike: none is part of it)."""
        tokens = list(self.matcher.compute_ff_tokens())
        self._check()
        if tokens:
            self.matcher.consume_tokens(tokens)
            self._check()
        if may_end and self.end_token is not None and self.matcher.is_stopped():
            tokens.append(self.end_token)
        return tokens

    def _check(self) -> None:
        """GrammarStopped once the matcher is in its error state: a grammar past llguidance's
        limits mid-answer (`root ::= "a" root` runs out of parser items), or a token it refused."""
        if self.matcher.is_error():
            raise GrammarStopped(f"the grammar stopped the answer: {_one_line(self.matcher.get_error())}")


class GrammarStopped(InvalidRequest):
    """The request's grammar cannot go on (its own error, not the engine's): the request ends
    with it, the others run on."""
