"""The engine's lanes (core/lanes/work_lane.py): every lane answers the whole WorkLane
interface, the tick loop calls them without asking what kind of work each is, and one tick
numbering runs through both lanes' records. No model."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from llamabatch import Engine, EngineConfig, SamplingParams
from llamabatch.core.lanes.embedding_lane import EmbeddingLane
from llamabatch.core.lanes.generation_lane import GenerationLane
from llamabatch.core.telemetry import TickRecord
from llamabatch.core.lanes.work_lane import WorkLane

from fake_runner import FakeRunner

ENGINE_PY = Path(__file__).resolve().parent.parent / "llamabatch" / "core" / "engine.py"


def interface() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(WorkLane).items()
            if callable(fn) and not name.startswith("_")}


def test_each_lane_answers_every_call_of_the_interface_with_its_parameters():
    for lane in (GenerationLane, EmbeddingLane):
        for name, wanted in interface().items():
            got = inspect.signature(getattr(lane, name))
            assert len(got.parameters) == len(wanted.parameters), f"{lane.__name__}.{name}{got}"


def test_the_engine_never_asks_which_kind_of_work_an_item_is():
    tree = ast.parse(ENGINE_PY.read_text())
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"]
    kinds = {ast.unparse(call.args[1]) for call in calls}
    assert not kinds & {"EmbedJob", "Sequence"}, kinds


def test_generation_and_embedding_ticks_share_one_numbering():
    runner = FakeRunner(embed_max_tokens=20, embed_max_seqs=3)
    runner.n_batch = 64
    ticks: list[int] = []
    engine = Engine(EngineConfig(n_parallel=runner.n_slots, n_batch=64, chunk_size=16), runner=runner,
                    default_params=SamplingParams(temperature=0, max_tokens=4))
    with engine:
        engine.subscribe(lambda record: ticks.append(record.tick) if isinstance(record, TickRecord) else None)
        assert [lane for lane in engine.lanes] == [engine.generation, engine.embedding]
        handle = engine.submit("hello there")
        engine.embed(["alpha", "beta"])
        handle.result(timeout=10)
    assert ticks and ticks == list(range(ticks[0], ticks[0] + len(ticks)))
