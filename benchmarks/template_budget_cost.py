"""What the chat-template budget (llamabatch/models/template_budget.py) costs a normal render.

Renders Gemma 3's official template and a ChatML template over conversations of 2, 20
and 200 messages, alternating the budgeted renderer and Jinja's plain ImmutableSandboxedEnvironment
with the same settings (the renderer before the budget), both through ChatTemplate.render
(which checks the messages first), and prints the fastest time per render of each and the
steps a render took (how far below the budget normal templates stay).

    python benchmarks/template_budget_cost.py [--repeat 2000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _bench import machine_line
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_chat_template import GEMMA3_TEXT_TEMPLATE  # noqa: E402  (the official template's text)

from llamabatch.models import template_budget  # noqa: E402
from llamabatch.models.chat_template import ChatTemplate, _generation_tag, jinja_template  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def conversation(n: int) -> list[dict]:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 20} for i in range(n - 1)]
    return [{"role": "system", "content": "Be terse."}, *turns] if n > 1 else turns


def unbudgeted(name: str, text: str) -> ChatTemplate:
    """The renderer as it was before the budget: the same sandbox settings, Jinja's render."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _generation_tag()])
    compiled = env.from_string(text)

    def render(messages: list[dict], add_generation_prompt: bool) -> str:
        prompt = compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                 bos_token="<bos>", eos_token="<eos>")
        return prompt[len("<bos>"):] if prompt.startswith("<bos>") else prompt

    return ChatTemplate(name, text, render)


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return min(samples)  # the least disturbed run: the machine is shared, medians wander by 2x


def steps_of(text: str, messages: list[dict]) -> int:
    env = template_budget.BudgetedSandbox(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(text)
    budget = template_budget.budget_for(messages)
    template_budget.render_within(env, compiled, {"messages": messages, "add_generation_prompt": True,
                                                  "bos_token": "<bos>", "eos_token": "<eos>"}, budget)
    return budget.steps - budget.left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2000, help="renders timed per case; the fastest counts")
    args = parser.parse_args()
    print(f"fastest of {args.repeat} renders; {machine_line()}")
    for name, text in (("gemma3 official", GEMMA3_TEXT_TEMPLATE), ("chatml", CHATML)):
        budgeted = jinja_template(name, text, "<bos>", "<eos>")
        plain = unbudgeted(name, text)
        for n in (2, 20, 200):
            messages = conversation(n)
            budgeted.render(messages)  # warm both
            plain.render(messages)
            a = timed(lambda: budgeted.render(messages), args.repeat)
            b = timed(lambda: plain.render(messages), args.repeat)
            print(f"{name:16} {n:3} messages: budgeted {a * 1e6:7.1f} us, plain sandbox {b * 1e6:7.1f} us "
                  f"(x{a / b:.2f}, +{(a - b) * 1e6:.1f} us); {steps_of(text, messages)} steps of "
                  f"{template_budget.budget_for(messages).steps:,} allowed")


if __name__ == "__main__":
    main()
