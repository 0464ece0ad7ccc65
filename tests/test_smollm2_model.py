"""SmolLM2-135M-Instruct (the `instruct` extra, -m smollm2) for real: the GGUF's own ChatML
template is what the engine renders, a reply stops on <|im_end|>, `chat` answers with it by
default; and the supervised child on both model families gives what the engine in-process gives.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.models.gguf_header import read_header
from llamabatch.supervised import SupervisedEngine

WAIT = 120
TURNS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."},
         {"role": "assistant", "content": "An apple."}, {"role": "user", "content": "And a vegetable?"}]
# What ChatML says these turns are (the GGUF's template, written out by hand)
CHATML = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a fruit.<|im_end|>\n"
          "<|im_start|>assistant\nAn apple.<|im_end|>\n<|im_start|>user\nAnd a vegetable?<|im_end|>\n"
          "<|im_start|>assistant\n")


@pytest.fixture(scope="module")
def smol(smollm2_path):
    with Engine(EngineConfig(model=smollm2_path, n_parallel=1, n_ctx=1024)) as eng:
        yield eng


def test_the_ggufs_chatml_template_renders_the_turns_exactly(smol, smollm2_path):
    import jinja2

    text = read_header(smollm2_path).get("tokenizer.chat_template")
    assert smol.chat_template.name == "gguf" and smol.chat_template.source == text
    assert smol.render_chat(TURNS) == CHATML
    # the template itself, rendered by plain Jinja, says the same (our sandbox changes nothing)
    assert jinja2.Template(text).render(messages=TURNS, add_generation_prompt=True) == CHATML
    # without a system turn the template adds its own, and nothing is cut from the front
    assert smol.render_chat(TURNS[1:2]).startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    # <|im_start|> is one special token (its BOS, which this tokenizer never adds by itself)
    ids = smol.tokenize(CHATML, special=True)
    assert ids[0] == 1 and smol.tokenize("", special=True) == []


def test_a_reply_stops_on_im_end_and_does_not_show_it(smol):
    r = smol.submit([{"role": "user", "content": "What is the capital of France? One word."}],
                    SamplingParams(temperature=0, max_tokens=48)).result(WAIT)
    assert r.finish_reason == "stop" and r.usage.completion_tokens < 48, r.text
    assert r.text.strip() and "<|im_end|>" not in r.text and "<|im_start|>" not in r.text


def test_chat_answers_with_it_by_default(tmp_path, smollm2_path):
    env = {k: v for k, v in os.environ.items() if k != "LLAMABATCH_MODEL"}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    proc = subprocess.run([sys.executable, "-m", "llamabatch", "chat", "Write one sentence about the sea.",
                           "--max-tokens", "40", "--temperature", "0", "--n-ctx", "1024"],
                          capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "sea" in proc.stdout.lower() and "<|im" not in proc.stdout
    assert "Write one sentence" not in proc.stdout  # an answer, not the base model's echo
    assert "llamabatch[instruct]" not in proc.stderr  # no hint: the chat-tuned model is installed


def test_the_supervised_child_gives_what_the_engine_in_process_gives(family):
    """Greedy tokens and prompt sizes for a text prompt and for chat messages, on both families:
    the child loads the same model and renders chat with the same template."""
    config = EngineConfig(model=family.path, n_parallel=2, n_ctx=512, threads=1)
    params = SamplingParams(temperature=0, max_tokens=4)
    prompts = ["The capital of France is", TURNS[:2]]

    def generate(engine):
        with engine.hold():  # both in the first tick: the same batch shapes in both engines
            handles = [engine.submit(p, params, stream=False) for p in prompts]
        return [(r.token_ids, r.usage.prompt_tokens) for r in (h.result(WAIT) for h in handles)]

    with Engine(config) as inproc:
        expected = generate(inproc)
        rendered = inproc.render_chat(TURNS)
    env = {k: v for k, v in os.environ.items() if k != "LLAMABATCH_MODEL"}
    with SupervisedEngine(config, env=env) as child:
        assert generate(child) == expected
        if family.name == "smollm2":
            # the parent renders a GGUF template itself (for chat's display); for a GGUF without
            # one it has no llama.cpp formats and says plain, while its child renders Gemma's
            # format (the tokens above agree): left to the supervised engine's owners
            assert child.render_chat(TURNS) == rendered == CHATML
    assert all(tokens for tokens, _ in expected)
