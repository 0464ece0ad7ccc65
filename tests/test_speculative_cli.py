"""`prediction` and `speculative` on run's lines and --speculative, on the scripted fake runner:
every line shape takes them, records say how many guesses were kept, bad predictions are
that line's error, and the summary line counts the guesses."""
from __future__ import annotations

import json

from cli_harness import invoke, runner_for

ANSWER = "the cat sat on the mat and the dog sat on the log"
TYPO = "teh cat sat on teh mat and the dog sat on the log"


def run_lines(lines: list[dict], *args: str):
    result = invoke(["run", "-", "--max-tokens", "100", "--temperature", "0", *args],
                    input="".join(json.dumps(line) + "\n" for line in lines),
                    runner=runner_for(lambda prompt: ANSWER, can_verify=True))
    records = {r.get("custom_id", r.get("id")): r for r in map(json.loads, result.stdout.splitlines())}
    return result, records


def chat_line(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": f"fix: {TYPO}"}], **body}}


def test_every_line_shape_takes_a_prediction():
    result, records = run_lines([
        chat_line("chat", prediction={"type": "content", "content": TYPO}),
        chat_line("parts", prediction={"type": "content", "content": [{"type": "text", "text": TYPO[:20]},
                                                                       {"type": "text", "text": TYPO[20:]}]}),
        {"custom_id": "completion", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": f"fix: {TYPO}", "prediction": {"type": "content", "content": TYPO}}},
        {"id": "plain", "prompt": f"fix: {TYPO}", "prediction": TYPO},
        {"id": "off", "prompt": f"fix: {TYPO}", "prediction": TYPO, "speculative": False},
    ])
    assert result.exit_code == 0, result.stderr
    for key in ("chat", "parts", "completion"):
        body = records[key]["response"]["body"]
        details = body["usage"]["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] > 0
        answer = body["choices"][0].get("message", {}).get("content") or body["choices"][0].get("text")
        assert answer == ANSWER
    assert records["plain"]["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    assert records["off"]["text"] == ANSWER and "completion_tokens_details" not in records["off"]["usage"]
    assert "speculative decoding:" in result.stderr and "guessed token(s) kept" in result.stderr


def test_bad_predictions_are_their_lines_errors():
    result, records = run_lines([
        chat_line("number", prediction=5),
        chat_line("kind", prediction={"type": "text", "content": TYPO}),
        chat_line("n", prediction=TYPO, n=2),
        {"id": "embed", "input": "hello", "prediction": TYPO},
        {"id": "fine", "prompt": "x", "prediction": TYPO},
    ])
    assert records["number"]["error"]["code"] == "invalid_request"
    assert "prediction must be" in records["number"]["error"]["message"]
    assert 'prediction type must be "content"' in records["kind"]["error"]["message"]
    assert "prediction cannot be combined with n > 1" in records["n"]["error"]["message"]
    assert "prediction" in records["embed"]["error"]["message"]
    assert records["fine"]["error"] is None


def test_speculative_off_flag():
    result, records = run_lines([{"id": "plain", "prompt": f"fix: {TYPO}", "prediction": TYPO}], "--speculative", "off")
    assert result.exit_code == 0, result.stderr
    assert records["plain"]["text"] == ANSWER and "completion_tokens_details" not in records["plain"]["usage"]
    bad = invoke(["run", "-", "--speculative", "sometimes"], input="hi\n", runner=runner_for(can_verify=True))
    assert bad.exit_code == 2 and "speculative must be one of" in bad.stderr
