"""Chat templates render within a step, time and size budget: a
template that loops 10^10 times used to stall every request for minutes. Past the budget
the render is that request's one-line invalid_request, and a GGUF's own template that
exceeds it at the load-time probe falls back to llama.cpp's built-in format."""
from __future__ import annotations

import json
import time

import pytest

from cli_harness import invoke, runner_for
from test_chat_template import FORMATS, GEMMA3_TEXT_TEMPLATE
from llamabatch.models import template_budget
from llamabatch.models.chat_template import from_gguf, jinja_template
from llamabatch.errors import InvalidRequest
from llamabatch.models.template_budget import Budget, BudgetedSandbox, TemplateBudgetExceeded, render_within

NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{{ messages[0].content }}"
HI = [{"role": "user", "content": "hi"}]
BOUND_S = 15  # generous on a loaded 2-core machine: the steps run out in about a second


@pytest.fixture(autouse=True)
def deadline_past_the_steps(monkeypatch):
    """These tests name the bound that stops a render (steps, size). The steps run out in about
    a second on a quiet machine, but on a loaded one (or beside other test workers) the 2-s
    deadline can come first: here it is moved past BOUND_S, so the step and size bounds are
    what is tested. The deadline has its own test, with its own explicit value."""
    monkeypatch.setattr(template_budget, "DEADLINE_S", BOUND_S)


def stopped(text: str, messages=HI) -> TemplateBudgetExceeded:
    t0 = time.perf_counter()
    with pytest.raises(TemplateBudgetExceeded) as info:
        jinja_template("t", text, "<bos>", "<eos>").render(messages)
    assert time.perf_counter() - t0 < BOUND_S
    assert isinstance(info.value, InvalidRequest) and "\n" not in str(info.value)
    return info.value


def test_reproducer_nested_loops_run_out_of_steps():
    steps = template_budget.STEPS_BASE + template_budget.STEPS_PER_MESSAGE
    assert str(stopped(NESTED)) == f"chat template 't' stopped: more than {steps:,} steps (a loop that does not end soon?)"


@pytest.mark.parametrize("text, says", [
    # a loop over the input's own characters, squared: counted like any loop
    ("{% for m in messages %}{% for c in m.content %}{% for d in m.content %}{% endfor %}{% endfor %}{% endfor %}",
     "steps"),
    # a recursive loop's deeper levels iterate through loop(...): counted too (1000^4 iterations;
    # its steps are slow enough that the deadline may come first)
    ("{% for x in range(1000) recursive %}{% if loop.depth < 4 %}{{ loop(range(1000)) }}{% endif %}{% endfor %}",
     "chat template 't' stopped: "),
    ('{{ "x" * 100000000 }}', "`*` would build 100,000,000 items"),
    ("{{ 2 ** 100000000 }}", "`**` would build an integer"),
    ('{% set ns = namespace(x="ab") %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}{{ ns.x }}',
     "`+` would build"),
    ('{% set ns = namespace(x="ab") %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}{{ ns.x }}',
     "`~` built"),
    ("{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}", "output longer than"),
])
def test_every_way_to_run_long_or_grow_large_is_stopped(text, says, monkeypatch):
    if says == "chat template 't' stopped: ":  # either bound may stop it: the deadline as shipped
        monkeypatch.setattr(template_budget, "DEADLINE_S", 2.0)
    messages = [{"role": "user", "content": "y" * 3000}]
    t0 = time.perf_counter()
    with pytest.raises(TemplateBudgetExceeded) as info:
        jinja_template("t", text, "", "").render(messages)
    assert time.perf_counter() - t0 < BOUND_S
    assert says in str(info.value) and "\n" not in str(info.value)


def test_the_deadline_stops_steps_that_are_slow_one_by_one():
    # each macro call costs one step but tens of microseconds: 2^30 of them would take hours
    env = BudgetedSandbox()
    compiled = env.from_string("{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}"
                               "{{ f(30) }}")
    t0 = time.perf_counter()
    with pytest.raises(TemplateBudgetExceeded, match=r"still rendering after 0.3 s"):
        render_within(env, compiled, {}, Budget(steps=10**12, output_chars=10**6, deadline_s=0.3))
    assert time.perf_counter() - t0 < BOUND_S


def test_normal_templates_render_as_before_and_far_below_the_budget():
    messages = [{"role": "system", "content": "Be terse."}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(20)]
    env = BudgetedSandbox(trim_blocks=True, lstrip_blocks=True)
    budget = template_budget.budget_for(messages)
    render_within(env, env.from_string(GEMMA3_TEXT_TEMPLATE),
                  {"messages": messages, "add_generation_prompt": True, "bos_token": "<bos>", "eos_token": "<eos>"},
                  budget)
    assert budget.steps - budget.left < 100  # one step per message here


def test_a_gguf_template_over_budget_falls_back_as_documented():
    template = from_gguf(NESTED, {"general.architecture": "gemma3"}, "<bos>", "<eos>", formats=FORMATS)
    assert template.name == "gemma"
    assert template.fallback_reason.startswith("the GGUF's chat template is unusable (chat template 'gguf' stopped: "
                                               "more than ")
    assert "llama.cpp's built-in gemma (from general.architecture 'gemma3')" in template.fallback_reason


def test_run_answers_a_chat_line_over_budget_with_its_error_and_the_rest_normally(tmp_path):
    template = tmp_path / "slow.jinja"
    template.write_text(NESTED)
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"id": "chat", "messages": HI}) + "\n" + json.dumps({"id": "plain", "prompt": "hi"}) + "\n")
    t0 = time.perf_counter()
    result = invoke(["run", str(inp), "--chat-template", str(template), "--n-parallel", "2", "--max-tokens", "3"],
                    runner=runner_for())
    assert time.perf_counter() - t0 < BOUND_S * 2
    assert result.exit_code == 0, result.stderr
    records = {r["id"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert records["chat"]["error"]["code"] == "invalid_request"
    assert "chat template" in records["chat"]["error"]["message"] and "stopped: more than" in records["chat"]["error"]["message"]
    assert records["plain"]["error"] is None and records["plain"]["text"]
