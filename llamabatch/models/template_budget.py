"""A time and size bound for rendering Jinja chat templates.

A chat template is user data (a --chat-template file, a GGUF's tokenizer.chat_template),
and Jinja's sandbox stops a template from reaching Python's internals but not from
running for ever: `{% for i in range(100000) %}{% for j in range(100000) %}` is 10^10
steps, minutes of a stalled engine. So every render gets a budget:

- steps: every loop iteration and every call the template makes (functions, macros,
  `range`, a recursive loop's `loop(...)`) costs one. Loops are counted by rewriting each
  `{% for %}`'s iterable, when the template is parsed, into `environment.counted(...)`;
  calls through the sandbox's own call hook. Without loops or calls a template is straight
  code, as long as its text. The limit is STEPS_BASE + STEPS_PER_MESSAGE per message; normal
  templates take a few dozen to a few hundred (benchmarks/template_budget_cost.py).
- a deadline: counting also checks the clock every 1024 steps (DEADLINE_S), for steps that
  are slow one by one.
- sizes: `*`, `**` and `+` are intercepted (the sandbox's binop hook) and refused before
  they build a string or list longer than the output cap or an integer of more than
  MAX_INT_BITS bits; `~` (not a hookable operator) is compiled to a join whose result is
  checked, so a string doubled in a loop stops at the cap; the rendered output is streamed
  and stopped past the output cap (OUTPUT_BASE + OUTPUT_PER_INPUT_CHAR x the messages' text).
Past any of them the render raises TemplateBudgetExceeded, an InvalidRequest: that
request's one-line error, and for a GGUF's template at the load-time probe, the documented
fallback to llama.cpp's built-in format (chat_template.from_gguf).

Not bounded here: one filter call that is slow or large on its own (`"x"|center(10**9)`).
"""
from __future__ import annotations

import threading
import time
from itertools import islice
from typing import Any, Iterable, Iterator

from jinja2 import Template, nodes
from jinja2.compiler import CodeGenerator
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import InvalidRequest

STEPS_BASE = 1_000_000  # loop iterations + calls: ~1 s of a tight template loop on this machine
STEPS_PER_MESSAGE = 10_000
DEADLINE_S = 2.0  # normal renders take well under a millisecond; a macro call costs ~30 us
CLOCK_EVERY = 1024  # steps between two looks at the clock
OUTPUT_BASE = 1 << 20  # characters
OUTPUT_PER_INPUT_CHAR = 4
MAX_INT_BITS = 1 << 16
JOIN_BATCH = 64  # output pieces joined at once between two size checks


class TemplateBudgetExceeded(InvalidRequest):
    """A chat template ran past its step, time or size bound."""


class Budget:
    def __init__(self, steps: int, output_chars: int, deadline_s: float | None = None):
        self.steps = steps
        self.left = steps
        self.output_chars = output_chars
        self.deadline_s = DEADLINE_S if deadline_s is None else deadline_s  # read when a render starts
        self.deadline = time.perf_counter() + self.deadline_s

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise TemplateBudgetExceeded(f"more than {self.steps:,} steps (a loop that does not end soon?)")
        if self.left % CLOCK_EVERY == 0 and time.perf_counter() > self.deadline:
            raise TemplateBudgetExceeded(f"still rendering after {self.deadline_s:g} s")


def budget_for(messages: list[dict]) -> Budget:
    chars = sum(len(m.get("content") or "") for m in messages)
    return Budget(STEPS_BASE + STEPS_PER_MESSAGE * len(messages), OUTPUT_BASE + OUTPUT_PER_INPUT_CHAR * chars)


class _SizedConcat(CodeGenerator):
    """Compiles `a ~ b` as Jinja does, wrapped in `environment.sized(...)`."""

    def visit_Concat(self, node: Any, frame: Any) -> None:
        self.write("environment.sized(")
        super().visit_Concat(node, frame)
        self.write(")")


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a per-render budget (see the module doc), which
    `render_within` sets for the thread that renders."""

    intercepted_binops = frozenset(["*", "**", "+"])
    code_generator_class = _SizedConcat

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._renders = threading.local()  # one template may render in several threads at once

    @property
    def budget(self) -> Budget | None:
        return getattr(self._renders, "budget", None)

    @budget.setter
    def budget(self, value: Budget | None) -> None:
        self._renders.budget = value

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # every loop iterates through counted()
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("counted"), [loop.iter], [], None, None,
                                   lineno=loop.lineno)
        return tree

    def counted(self, iterable: Iterable[Any]) -> Iterator[Any]:
        budget = self.budget
        if budget is None:
            yield from iterable
            return
        for item in iterable:
            budget.spend()
            yield item

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (Jinja's spelling)
        budget = __self.budget
        if budget is not None:
            budget.spend()
            if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level: count it too
                args = (__self.counted(args[0]), *args[1:])
        return super().call(__context, __obj, *args, **kwargs)

    def sized(self, text: str) -> str:
        """The result of a `~`, refused past the output cap (it was built, once: at most 2x)."""
        if len(text) > OUTPUT_BASE and len(text) > self._cap():
            raise TemplateBudgetExceeded(f"`~` built {len(text):,} characters (the cap is {self._cap():,})")
        return text

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        # Hot: Gemma-style templates build every turn with `+`. Below OUTPUT_BASE (the
        # smallest cap there is) nothing can be too long, so most operations skip the lookup
        # of the render's budget.
        if operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) \
                    and len(left) + len(right) > OUTPUT_BASE and len(left) + len(right) > self._cap():
                raise TemplateBudgetExceeded(f"`+` would build {len(left) + len(right):,} items "
                                             f"(the cap is {self._cap():,})")
            return left + right
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and len(seq) * count > self._cap():
                    raise TemplateBudgetExceeded(f"`*` would build {len(seq) * count:,} items "
                                                 f"(the cap is {self._cap():,})")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 \
                    and max(1, abs(left).bit_length()) * right > MAX_INT_BITS:
                raise TemplateBudgetExceeded(f"`**` would build an integer of more than {MAX_INT_BITS:,} bits")
        return super().call_binop(context, operator, left, right)

    def _cap(self) -> int:
        budget = self.budget
        return budget.output_chars if budget else OUTPUT_BASE


def render_within(env: BudgetedSandbox, template: Template, variables: dict[str, Any], budget: Budget) -> str:
    """Render `template` (compiled by `env`) with `variables` within `budget`.
    Raises TemplateBudgetExceeded.

    The output is joined in batches of JOIN_BATCH pieces (a C-level join each, not a Python
    step per piece, which doubled the cost of a normal render) and its size checked after
    each batch: a render stops at most one batch past the output cap."""
    env.budget = budget
    pieces = template.root_render_func(template.new_context(variables))
    parts: list[str] = []
    size = 0
    try:
        while True:
            part = "".join(islice(pieces, JOIN_BATCH))
            if not part:
                return "".join(parts)
            size += len(part)
            if size > budget.output_chars:
                raise TemplateBudgetExceeded(f"output longer than {budget.output_chars:,} characters")
            parts.append(part)
    finally:
        env.budget = None
