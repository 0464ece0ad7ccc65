"""The call syntaxes beside Hermes' (constraints/tool_syntax.py): which one a template teaches,
the grammar of each in every mode (it compiles in llguidance), reading calls back out of an
answer whole and streamed, and the engine rebuilding a request's grammar in its template's
syntax, with the Result saying which one it used (scripted fake runner)."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import llguidance
import pytest

from llamabatch import Engine, EngineConfig
from llamabatch.constraints.tool_grammar import ToolGrammar, tool_grammar
from llamabatch.constraints.tool_syntax import HERMES, LLAMA3, MISTRAL, syntax_of_template
from llamabatch.openai_format import CHAT_URL, LineParser, ToolCallSplitter, build_record, split_tool_calls
from llamabatch.params import SamplingParams

from fake_runner import FakeRunner

TEMPLATES = Path(__file__).parent / "templates"
TOOLS = [("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
         ("get_time", {"type": "object", "properties": {"tz": {"type": "string"}}})]
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
UTC = {"name": "get_time", "arguments": {"tz": "UTC"}}
LLAMA3_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL_CALLS = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"tz": "UTC"}}]'


@pytest.mark.parametrize("template, syntax", [
    ("hermes_tools.jinja", HERMES), ("llama3_tools.jinja", LLAMA3), ("mistral_tools.jinja", MISTRAL)])
def test_a_template_teaches_its_syntax(template, syntax):
    assert syntax_of_template((TEMPLATES / template).read_text()) is syntax


def test_a_template_that_names_no_syntax_gets_hermes():
    assert syntax_of_template("{% for tool in tools %}{{ tool | tojson }}{% endfor %}") is HERMES
    assert syntax_of_template(None) is HERMES


@pytest.mark.parametrize("syntax", [HERMES, LLAMA3, MISTRAL])
@pytest.mark.parametrize("mode", ["required", "auto"])
@pytest.mark.parametrize("parallel", [True, False])
def test_every_syntax_and_mode_compiles_in_llguidance(syntax, mode, parallel):
    grammar = tool_grammar(TOOLS, mode, parallel, syntax)
    assert grammar.syntax == syntax.name
    assert llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(str(grammar))) == ""


def test_a_tool_grammar_travels_by_pickle_and_rebuilds_in_another_syntax():
    grammar = tool_grammar(TOOLS, "auto", True)
    again = pickle.loads(pickle.dumps(grammar))
    assert isinstance(again, ToolGrammar) and again == grammar and again.syntax == "hermes"
    mistral = again.for_syntax(MISTRAL)
    assert mistral.syntax == "mistral" and '"[TOOL_CALLS]"' in mistral and again.for_syntax(HERMES) is again


def streamed(text: str, syntax, step: int = 1) -> list:
    splitter = ToolCallSplitter(syntax)
    events = []
    for i in range(0, len(text), step):
        events += splitter.feed(text[i:i + step])
    return events + splitter.finish()


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_llama3_calls_read_whole_and_split_across_tokens(step):
    text = "Let me check. " + LLAMA3_CALL + "\n" + LLAMA3_CALL.replace("get_weather", "get_time").replace('"city": "Paris"', '"tz": "UTC"')
    events = streamed(text, LLAMA3, step)
    assert [v for k, v in events if k == "call"] == [PARIS, UTC]
    assert "".join(v for k, v in events if k == "content") == "Let me check. "
    assert split_tool_calls(text, LLAMA3) == ("Let me check. ", [PARIS, UTC])


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_mistral_calls_are_one_array_after_the_opener(step):
    events = streamed(MISTRAL_CALLS, MISTRAL, step)
    assert [v for k, v in events if k == "call"] == [PARIS, UTC]
    assert not [v for k, v in events if k == "content"]


@pytest.mark.parametrize("syntax, cut", [(LLAMA3, LLAMA3_CALL[:30]), (MISTRAL, MISTRAL_CALLS[:40])])
def test_a_call_that_never_closes_is_content(syntax, cut):
    assert split_tool_calls("Sure. " + cut, syntax) == ("Sure. " + cut, [])
    assert "".join(v for _k, v in streamed("Sure. " + cut, syntax)) == "Sure. " + cut


def test_an_opener_followed_by_no_json_is_text():
    text = "the tag [TOOL_CALLS] means nothing here"
    assert split_tool_calls(text, MISTRAL) == (text, [])
    assert "".join(v for _k, v in streamed(text, MISTRAL)) == text


def test_braces_inside_strings_do_not_end_a_call():
    call = '{"name": "get_weather", "parameters": {"city": "P}a]r\\"is{"}}'
    content, calls = split_tool_calls(call + " done", LLAMA3)
    assert calls == [{"name": "get_weather", "arguments": {"city": 'P}a]r"is{'}}] and content == " done"


def test_the_engine_rebuilds_the_grammar_in_its_templates_syntax_and_the_record_reads_it():
    """A template teaching Llama 3's syntax: the sampler gets the llama3 grammar, the Result
    names it, and the record's calls come out of the llama3 text."""
    runner = FakeRunner(n_slots=1, slot_ctx=4096, reply=lambda prompt: LLAMA3_CALL,
                        metadata={"general.architecture": "fake",
                                  "tokenizer.chat_template": (TEMPLATES / "llama3_tools.jinja").read_text()})
    tool = {"type": "function", "function": {"name": TOOLS[0][0], "parameters": TOOLS[0][1]}}
    line = {"custom_id": "a", "url": CHAT_URL, "body": {"messages": [{"role": "user", "content": "Paris?"}],
                                                          "tools": [tool], "tool_choice": "required"}}
    item = LineParser(SamplingParams(temperature=0), input_format="jsonl").parse(json.dumps(line), 1)
    assert item.params.grammar.syntax == "hermes"  # built before any template is known
    with Engine(EngineConfig(n_parallel=1, n_ctx=4096), runner=runner) as engine:
        result = engine.submit(item.prompt, item.params).result(timeout=30)
    assert runner.samplers[-1].params.grammar.syntax == "llama3" and '{\\"name\\": \\"get_weather' in runner.samplers[-1].params.grammar
    assert result.tool_syntax == "llama3"
    choice = build_record(item, result, "m")["response"]["body"]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"city": "Paris"}]
