"""Grammars that would crash llama.cpp, or tie it up, refused before any backend sees them.

A request's GBNF text reaches llama.cpp's grammar code whenever the llama backend takes it
(--grammar-backend llama, or auto where llguidance cannot read it), and a C++ exception or a
stack overflow there takes the whole process down. gbnf_shape.measure reads the text the way
llama.cpp's parser does; these bounds refuse every class of input that is known to do harm:

- a position no token can satisfy: a string holding NUL or a surrogate, or a character class
  whose set of characters (1..U+10FFFF less the surrogates U+D800-U+DFFF) is empty (positive or
  negated: [^\\x01-\\U0010FFFF], [z-a], [\\uD800-\\uDFFF], ranges that together cover everything).
  Each token's text decodes to code points ending in NUL, which never matches, so every
  candidate is rejected, one is sampled anyway, and accepting it throws "Unexpected empty
  grammar stack after accepting piece": std::terminate, abort. A surrogate is half of a UTF-16
  pair, not a character: bytes that try to spell one decode to U+FFFD, which it does not match;
- a repetition {m,n} with n < m: llama.cpp counts n - m optional copies in an unsigned
  integer and builds rules until memory runs out ("x"{5,2}: 13 s, then bad_alloc at 2 GB);
- nesting of ( ) groups: llama.cpp parses a group by recursion (parse_alternates ->
  parse_sequence -> parse_alternates) and overflows a thread's stack;
- rules: its left-recursion check recurses once per rule along a chain of references, so the
  count of rules bounds that depth; repetitions create rules ({0,n}: n of them);
- elements after repetitions are expanded ("...40 KB..."{2000} is 80 million of them);
- the depth of rule references (reference_graph.reach: r0 ::= r1, r1 ::= r2, ..., a group is a
  level too, each cycle of recursive rules counted whole): llguidance compiles a grammar by
  recursion along its references, on the thread that submits the request, and overflows its
  stack (SIGSEGV) where llama.cpp answers;
- a repetition's count: llguidance expands "x"{n} and, once the answer reaches it, runs past its
  parser's items a step ("Too many items") mid-answer; llama.cpp refuses a minimum over 2,000;
- the text's size itself, the same bound on every backend.

Each bound was measured against llama.cpp's grammar code (llama_grammar_init_impl) in a child
process, on threads of 256 KiB, 1 MiB and 8 MiB of stack, and the depth and count against both
backends through the engine (benchmarks/grammar_limits.py; the figures are in
docs/structured-output.md). Grammars are parsed on the thread that submits the request
(Engine.submit builds the sampler and compiles llguidance's matcher), a thread of the default
8 MiB of stack.
"""
from __future__ import annotations

from .gbnf_shape import measure
from .reference_graph import reach

MAX_GRAMMAR_BYTES = 512 * 1024  # a grammar's or schema's text; a 10,000-string enum is ~200 KB
# llama.cpp's parser takes ~450 bytes of stack per group level: 20,000 levels overflow the 8 MiB a
# thread gets by default (it survived 18,707), a 1 MiB stack survived 2,323, 256 KiB 568.
MAX_GROUP_DEPTH = 1000
# Its left-recursion check takes ~128 bytes of stack per rule along a chain (256 KiB survived
# 2,003 rules, 1 MiB 8,147): 10,000 rules need ~1.3 MB, a sixth of a default thread's stack.
MAX_GRAMMAR_RULES = 10_000
# "...40 KB..."{2000} (80 million elements) took 6 s and 1.7 GB to parse; this bound is 16 MB.
MAX_GRAMMAR_ELEMENTS = 2_000_000
MAX_REFERENCE_DEPTH = 1000  # rules reached through rules; llguidance's compiler overflows a stack past it
MAX_REPETITION_COUNT = 10_000  # the largest number in a {m,n}; llguidance stops mid-answer past it


def size_problem(what: str, text: str) -> str | None:
    """The one size bound every grammar and schema text is held to, as a message, or None."""
    if len(text) > MAX_GRAMMAR_BYTES:
        return f"{what} has {len(text):,} characters, more than the {MAX_GRAMMAR_BYTES:,} a grammar may have"
    return None


def grammar_problem(grammar: str, what: str = "grammar") -> str | None:
    """Why llama.cpp must not be given this GBNF text (one line, starting with `what`), or None."""
    too_big = size_problem(what, grammar)
    if too_big:
        return too_big
    shape = measure(grammar)
    if shape.unmatchable is not None:
        return (f"{what}: {shape.unmatchable} matches no character a token can produce "
                "(NUL, surrogates U+D800-U+DFFF and code points past U+10FFFF never match)")
    if shape.reversed_repetition is not None:
        return f"{what}: the repetition {shape.reversed_repetition} has a maximum below its minimum"
    if shape.group_depth > MAX_GROUP_DEPTH:
        return f"{what} nests ( ) groups {shape.group_depth:,} deep; at most {MAX_GROUP_DEPTH:,} levels are allowed"
    if shape.rules > MAX_GRAMMAR_RULES:
        return (f"{what} makes {shape.rules:,} rules (each group and each optional repetition is one); "
                f"at most {MAX_GRAMMAR_RULES:,} are allowed")
    if shape.elements > MAX_GRAMMAR_ELEMENTS:
        return (f"{what} expands to {shape.elements:,} elements once its repetitions are written out; "
                f"at most {MAX_GRAMMAR_ELEMENTS:,} are allowed")
    if shape.largest_count > MAX_REPETITION_COUNT:
        return (f"{what} repeats an item {shape.largest_count:,} times; a repetition's count may be at most "
                f"{MAX_REPETITION_COUNT:,}")
    depth = reach(shape.references).depth
    if depth > MAX_REFERENCE_DEPTH:
        return (f"{what} nests rules {depth:,} deep (a rule referring to a rule, ..., each group one more); "
                f"at most {MAX_REFERENCE_DEPTH:,} levels are allowed")
    return None
