"""Input preparation on its own: prompt -> tokens -> Sequence, chat rendering, the seed
and the sampler. No engine, no thread."""
from __future__ import annotations

import pytest

from llamabatch import ContextOverflow, InvalidRequest, SamplingParams
from llamabatch.core.inputs import InputPreparer, is_chat
from llamabatch.core.sequence import Status
from llamabatch.in_process.engine_parts import GgufChatTemplates

from fake_runner import FakeRunner, text_tokens

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def preparer(**kw) -> tuple[InputPreparer, FakeRunner]:
    runner = FakeRunner(n_slots=1, slot_ctx=kw.pop("slot_ctx", 64), metadata=kw.pop("metadata", None))
    return InputPreparer(runner, runner.slot_ctx, GREEDY, chat_templates=GgufChatTemplates(), **kw), runner


def test_without_chat_templates_chat_messages_are_one_request_error():
    runner = FakeRunner(n_slots=1, slot_ctx=64)
    bare = InputPreparer(runner, runner.slot_ctx, GREEDY)
    assert bare.prepare(1, "plain text", None).prompt == text_tokens("plain text")
    with pytest.raises(InvalidRequest, match="chat messages need a chat template"):
        bare.prepare(2, [{"role": "user", "content": "hi"}], None)


def test_text_and_token_ids_become_a_waiting_sequence_with_its_sampler():
    prep, runner = preparer(default_seed=42)
    seq = prep.prepare(7, "hello", None)
    assert (seq.request_id, seq.prompt, seq.status, seq.seed) == (7, text_tokens("hello"), Status.WAITING, 42)
    assert seq.params == GREEDY and seq.sampler is runner.samplers[0] and seq.sampler.seed == 42
    ids = prep.prepare(8, [104, 105], GREEDY.replace(seed=3))
    assert ids.prompt == [104, 105] and ids.seed == 3


def test_a_request_seed_wins_over_the_engine_seed_and_no_seed_is_random():
    prep, _ = preparer()
    seeds = {prep.prepare(i, "x", None).seed for i in range(5)}
    assert len(seeds) > 1  # random per request when neither sets one


def test_chat_messages_are_rendered_and_the_plain_template_adds_its_stop():
    prep, _ = preparer(metadata={"general.architecture": "unknown-arch"})
    messages = [{"role": "user", "content": "hi"}]
    assert is_chat(messages) and not is_chat([]) and not is_chat("hi")
    seq = prep.prepare(0, messages, None)
    assert seq.prompt == text_tokens(prep.render_chat(messages))
    assert prep.chat_template.stop and all(s in seq.params.stop for s in prep.chat_template.stop)


@pytest.mark.parametrize("prompt, params, error", [
    ("", None, InvalidRequest),
    ([], None, InvalidRequest),
    ([1, -5], None, InvalidRequest),
    (12345, None, InvalidRequest),
    ([{"role": "wizard", "content": "x"}], None, InvalidRequest),
    ("x" * 64, None, ContextOverflow),
    ("hi", SamplingParams(max_tokens=0), InvalidRequest),
    ("hi", SamplingParams(grammar="BAD"), InvalidRequest),
])
def test_bad_input_raises_and_leaves_no_sampler_to_free(prompt, params, error):
    prep, runner = preparer()
    with pytest.raises(error):
        prep.prepare(0, prompt, params)
    assert runner.samplers == []  # the fake refuses "BAD" before making one
