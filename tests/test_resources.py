"""Resources checked before they are taken (a billion-token context, more threads than CPUs): the KV cache and
weights a configuration needs against the memory available and `max_memory`, and the thread
count against the CPUs. Figures are computed from GGUF metadata as llama.cpp sizes its
cache; the CLI tests use the real engine factory, which refuses before any model loads."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_harness import invoke
from llamabatch import EngineConfig
from llamabatch.errors import InvalidRequest, ResourceLimit
from llamabatch.checks.max_memory import memory_cap
from llamabatch.kernel_paths.resources import check, check_addition, needs

GIB, MIB = 2**30, 2**20
PER_LAYER = 1 * (256 + 256) * 2  # Gemma 3 270M: 1 KV head x (key 256 + value 256) x f16
GEMMA_META = {"general.architecture": "gemma3", "gemma3.block_count": 18, "gemma3.attention.head_count": 4,
              "gemma3.attention.head_count_kv": 1, "gemma3.embedding_length": 640,
              "gemma3.attention.key_length": 256, "gemma3.attention.value_length": 256,
              "gemma3.attention.sliding_window": 512}


def test_kv_need_counts_every_slot_and_the_full_size_window_when_caching():
    # prompt caching (the default) turns swa_full on: all 18 layers hold every cell
    need = needs(EngineConfig(n_parallel=4, n_ctx=4096), GEMMA_META, weights=100 * MIB)
    assert (need.sequences, need.cells) == (4, 4096)
    assert need.kv_bytes == 18 * PER_LAYER * 4096
    assert need.total == need.kv_bytes + 100 * MIB


def test_without_caching_gemma3_window_layers_are_counted_at_full_size_as_the_runner_keeps_them():
    config = EngineConfig(n_parallel=4, n_ctx=4 * 8192, n_batch=512, cache_prompt=False)
    need = needs(config, GEMMA_META, weights=0)
    assert need.kv_bytes == 18 * PER_LAYER * 4 * 8192


def test_deterministic_mode_counts_its_spare_sequence_ids():
    # 3 slots: padded to the widest row rule (8 rows), so 8 sequence ids of slot_ctx cells each
    need = needs(EngineConfig(n_parallel=3, n_ctx=3 * 1024, deterministic=True), GEMMA_META, weights=0)
    assert (need.sequences, need.cells) == (8, 8 * 1024)
    assert need.kv_bytes == 18 * PER_LAYER * 8 * 1024


def test_reproducer_a_billion_token_context_is_refused_with_the_setting_and_the_figure():
    config = EngineConfig(n_parallel=4, n_ctx=1_000_000_000)
    with pytest.raises(ResourceLimit) as info:
        check(config, "model.gguf", metadata=GEMMA_META, memory=23 * GIB, cpus=2)
    message = str(info.value)
    assert "\n" not in message and isinstance(info.value, InvalidRequest)  # one line, exit 2 in the CLI
    tib = 1_000_000_000 * 18 * PER_LAYER / 2**40  # every cell of every layer: 16.8 TiB
    assert message.startswith(f"n_ctx 1000000000 needs {tib:.1f} TiB of KV cache (4 slots x 250,000,000 tokens "
                              "x 18.0 KiB per token in f16/f16)")
    assert "(max_memory 90%; 23.0 GiB available now): lower n_ctx" in message


def test_the_default_fits_and_max_memory_caps_it():
    config = EngineConfig(n_parallel=8)  # 8 x 4096 tokens: 576 MiB of KV cache
    need = check(config, "model.gguf", metadata=GEMMA_META, memory=23 * GIB, cpus=2)
    assert need.kv_bytes == 18 * PER_LAYER * 8 * 4096
    with pytest.raises(ResourceLimit, match=r"^n_parallel 8 \(4096 tokens per slot\) needs 576.0 MiB .* "
                                            r"more than the 512.0 MiB allowed \(max_memory 512M;"):
        check(config.replace(max_memory="512M"), "model.gguf", metadata=GEMMA_META, memory=23 * GIB, cpus=2)
    assert check(config.replace(max_memory="off"), "model.gguf", metadata=GEMMA_META, memory=MIB, cpus=2)


def test_weights_over_the_cap_are_named_as_the_cause(tmp_path):
    model = tmp_path / "big.gguf"
    with open(model, "wb") as f:
        f.truncate(2 * GIB)  # sparse: 2 GiB by size, nothing on disk
    with pytest.raises(ResourceLimit, match=r"^the model's weights alone need 2.0 GiB, more than the 1.0 GiB allowed "
                                            r"\(max_memory 1G; 23.0 GiB available now\): use a smaller model or "
                                            r"raise max_memory$"):
        check(EngineConfig(n_parallel=1, n_ctx=256, max_memory="1G"), str(model), metadata=GEMMA_META,
              memory=23 * GIB, cpus=2)


def test_max_memory_spellings():
    assert memory_cap("50%", 10 * GIB) == 5 * GIB
    assert memory_cap("16GiB", 1) == 16 * GIB and memory_cap("2g", 1) == 2 * GIB and memory_cap(4096, 1) == 4096
    assert memory_cap("off", 1) is None and memory_cap(None, 100) == 90
    for bad in ("lots", "0", "150%", "-1G", True):
        with pytest.raises(InvalidRequest, match="max_memory must be bytes, a size"):
            EngineConfig(max_memory=bad).validate()


def test_threads_far_above_the_cpus_are_refused():
    with pytest.raises(ResourceLimit) as info:
        check(EngineConfig(n_parallel=2, threads=100_000), "model.gguf", metadata=GEMMA_META, memory=GIB, cpus=2)
    assert str(info.value) == ("threads 100000 is more than 4 per CPU this process may use (2 CPUs, so at most 8); "
                               "llama.cpp starts every one of them: use --threads 2 or fewer")
    check(EngineConfig(n_parallel=2, threads=8), "model.gguf", metadata=GEMMA_META, memory=GIB, cpus=2)  # allowed


def test_default_threads_are_the_cpus_this_process_may_use_not_the_machines():
    # taskset or a container's cpuset: os.cpu_count() still gives the machine's count, and a
    # thread more than the CPUs allowed stalls llama.cpp's others at every graph node
    script = ("import os; from llamabatch.config import EngineConfig; from llamabatch.checks.cpus import usable_cpus; "
              "print(os.cpu_count(), usable_cpus(), EngineConfig().n_threads, EngineConfig(threads=3).n_threads)")
    allowed = sorted(os.sched_getaffinity(0))[:1]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, allowed)).stdout.split()
    assert out == [str(os.cpu_count()), "1", "1", "3"]


@pytest.mark.parametrize("args, starts", [
    (["--n-parallel", "4", "--n-ctx", "1000000000"], "n_ctx 1000000000 needs "),
    (["--n-parallel", "auto", "--n-ctx", "1000000000"], "n_ctx 1000000000 needs "),
    (["--n-parallel", "2", "--threads", "100000"], "threads 100000 is more than 4 per CPU"),
    # weights fit; n_ctx given (auto would size the slots to what max_memory holds)
    (["--n-parallel", "8", "--n-ctx", "32768", "--max-memory", "300M"], "n_ctx 32768 needs "),
    (["--n-parallel", "1", "--max-memory", "1M"], "the model's weights alone need "),
])
def test_run_refuses_in_one_line_exit_2_before_any_engine_starts(tmp_path, model_path, args, starts):
    inp = tmp_path / "base.jsonl"
    inp.write_text('{"prompt": "hi"}\n{"prompt": "there"}\n')
    out = tmp_path / "x.out"
    result = invoke(["run", str(inp), "--max-tokens", "1", "-m", model_path, "-o", str(out), *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"llamabatch: error: {starts}"), result.stderr
    assert not out.exists()  # nothing was written, not even an empty OUTPUT


def test_the_in_process_engine_refuses_before_creating_the_context(model_path):
    # the library path (no supervising parent): the runner checks after the weights load and
    # before llama.cpp allocates the KV cache, with the metadata llama.cpp itself read
    from llamabatch import Engine

    with pytest.raises(ResourceLimit, match=r"^n_ctx 1000000000 needs .* TiB of KV cache"):
        Engine(EngineConfig(model=model_path, n_parallel=4, n_ctx=1_000_000_000, threads=1))


def test_an_addition_fits_in_what_a_size_leaves_or_in_a_share_of_what_is_available_now():
    sized = EngineConfig(n_parallel=1, max_memory="1G")
    check_addition(sized, 300 * MIB, 600 * MIB, "the embedding context", memory=23 * GIB)  # 900 MiB of 1 GiB
    with pytest.raises(ResourceLimit, match=r"^the embedding context needs 500.0 MiB, more than the 424.0 MiB "
                                            r"max_memory 1G leaves beside the engine's 600.0 MiB: raise max_memory "
                                            r"or lower n_batch$"):
        check_addition(sized, 500 * MIB, 600 * MIB, "the embedding context", memory=23 * GIB)
    with pytest.raises(ResourceLimit, match=r"more than the 100.0 MiB max_memory 1G leaves"):  # never past what is free
        check_addition(sized, 200 * MIB, 0, "the embedding context", memory=100 * MIB)
    shared = EngineConfig(n_parallel=1)  # the default, 90% of what is available now
    check_addition(shared, 800 * MIB, 20 * GIB, "the embedding context", memory=1 * GIB)
    with pytest.raises(ResourceLimit, match=r"needs 950.0 MiB, more than the 921.6 MiB max_memory 90% allows of the "
                                            r"1.0 GiB available now"):
        check_addition(shared, 950 * MIB, 0, "the embedding context", memory=1 * GIB)
    check_addition(shared.replace(max_memory="off"), 10 * GIB, 0, "the embedding context", memory=MIB)


# -- KV cache types: what each type takes, as ggml_row_size counts it --------------------------

@pytest.mark.parametrize(("type_k", "type_v", "bytes_per_layer"), [
    ("f16", "f16", 256 * 2 + 256 * 2),
    ("bf16", "f16", 256 * 2 + 256 * 2),
    ("q8_0", "q8_0", 8 * 34 + 8 * 34),  # 256 values = 8 blocks of 32, 34 bytes each
    ("q4_0", "q4_0", 8 * 18 + 8 * 18),
    ("q8_0", "f16", 8 * 34 + 256 * 2),
    ("q4_1", "q5_0", 8 * 20 + 8 * 22),
    ("q5_1", "iq4_nl", 8 * 24 + 8 * 18),
])
def test_kv_need_takes_the_bytes_of_the_configured_cache_types(type_k, type_v, bytes_per_layer):
    config = EngineConfig(n_parallel=4, n_ctx=4096, cache_type_k=type_k, cache_type_v=type_v)
    need = needs(config, GEMMA_META, weights=0)
    assert need.per_token == 18 * bytes_per_layer
    assert need.kv_bytes == 18 * bytes_per_layer * 4096


def test_q8_0_keys_and_values_take_at_most_055_of_f16():
    f16 = needs(EngineConfig(n_parallel=8), GEMMA_META, weights=0).kv_bytes
    q8 = needs(EngineConfig(n_parallel=8, cache_type_k="q8_0", cache_type_v="q8_0"), GEMMA_META, weights=0).kv_bytes
    assert q8 / f16 == 34 / 64


def test_a_context_that_fits_only_in_q8_0_is_refused_in_f16_with_the_way_out_and_allowed_in_q8_0():
    config = EngineConfig(n_parallel=8, n_ctx=8 * 8192, max_memory="1GiB")
    f16_kv = 18 * PER_LAYER * 8 * 8192  # 1.125 GiB: over the cap, q8_0's 0.6 GiB under it
    assert f16_kv > GIB
    with pytest.raises(ResourceLimit, match=r"in f16/f16\).*or use --cache-type-k q8_0 --cache-type-v q8_0$"):
        check(config, "model.gguf", metadata=GEMMA_META, memory=23 * GIB, cpus=2)
    need = check(config.replace(cache_type_k="q8_0", cache_type_v="q8_0"), "model.gguf", metadata=GEMMA_META,
                 memory=23 * GIB, cpus=2)
    assert need.kv_bytes == f16_kv * 34 // 64


def test_a_head_size_the_block_type_cannot_split_is_refused_naming_the_types_the_model_takes():
    meta = dict(GEMMA_META, **{"gemma3.attention.key_length": 80, "gemma3.attention.value_length": 80})
    config = EngineConfig(n_parallel="auto", cache_type_k="q8_0", cache_type_v="q8_0")
    with pytest.raises(InvalidRequest) as info:
        check(config, "model.gguf", metadata=meta, memory=23 * GIB, cpus=2)
    assert str(info.value) == ("cache_type_k q8_0 cannot hold this model's attention heads of 80 values "
                               "(blocks of 32); this model takes: f16, bf16")
