"""--cache-type-k / --cache-type-v / --flash-attn: each layer (flag, env, config file) reaches
llama.cpp's context parameters; bad values and combinations llama.cpp or deterministic mode
cannot run are one line (exit 2) before any model loads."""
from __future__ import annotations

import textwrap

import pytest
from llama_cpp import llama_cpp as C

from cli_harness import invoke, runner_for
from llamabatch import EngineConfig
from llamabatch.errors import InvalidRequest
from llamabatch.kernel_paths import batch_invariance as invariance
from llamabatch.llama.load import context_params
from llamabatch.settings.file_layer import resolve_settings


@pytest.fixture(autouse=True)
def clean_env(settings_sandbox):
    return settings_sandbox  # conftest.py: no outside LLAMABATCH_*, an empty config dir, cwd in tmp


def cparams_of(config: EngineConfig):
    return context_params(config.replace(n_parallel=2), None, 2)


@pytest.mark.parametrize("layer", ["flag", "env", "file"])
def test_each_layer_reaches_the_context_parameters(clean_env, monkeypatch, layer):
    flags = {"n_parallel": "2"}
    if layer == "flag":
        flags |= {"cache_type_k": "q8_0", "cache_type_v": "q4_0", "flash_attn": "on"}
    elif layer == "env":
        monkeypatch.setenv("LLAMABATCH_CACHE_TYPE_K", "q8_0")
        monkeypatch.setenv("LLAMABATCH_CACHE_TYPE_V", "q4_0")
        monkeypatch.setenv("LLAMABATCH_FLASH_ATTN", "on")
    else:
        (clean_env / "llamabatch.toml").write_text(textwrap.dedent("""\
            cache_type_k = "q8_0"
            [run]
            cache_type_v = "q4_0"
            flash_attn = "on"
            """))
    resolved = resolve_settings(flags, "run")
    engine = resolved.engine
    assert (engine.cache_type_k, engine.cache_type_v, engine.flash_attn) == ("q8_0", "q4_0", "on")
    assert resolved.sources["cache_type_k"].startswith({"flag": "flag", "env": "env LLAMABATCH_CACHE_TYPE_K",
                                                        "file": str(clean_env / "llamabatch.toml")}[layer])
    cparams = cparams_of(engine)
    assert (cparams.type_k, cparams.type_v) == (C.GGML_TYPE_Q8_0, C.GGML_TYPE_Q4_0)
    assert cparams.flash_attn_type == C.LLAMA_FLASH_ATTN_TYPE_ENABLED


def test_the_defaults_are_llama_cpps_f16_cache_and_automatic_flash_attention():
    engine = resolve_settings({"n_parallel": "2"}, "run").engine
    assert (engine.cache_type_k, engine.cache_type_v, engine.flash_attn) == ("f16", "f16", "auto")
    cparams = cparams_of(engine)
    default = C.llama_context_default_params()
    assert (cparams.type_k, cparams.type_v, cparams.flash_attn_type) == (
        default.type_k, default.type_v, default.flash_attn_type)


@pytest.mark.parametrize("name, ggml", [("f16", 1), ("bf16", 30), ("q8_0", 8), ("q4_0", 2), ("q4_1", 3),
                                        ("iq4_nl", 20), ("q5_0", 6), ("q5_1", 7)])
def test_every_type_name_maps_to_ggmls_type_id(name, ggml):
    assert cparams_of(EngineConfig(cache_type_k=name, cache_type_v="f16")).type_k == ggml


def test_deterministic_mode_keeps_flash_attention_off_under_auto():
    config = EngineConfig(n_parallel=2, deterministic=True)
    shapes = invariance.Shapes(invariance.REPACK_GEMM_TILE, invariance.TILED_MIN_BATCH)
    assert context_params(config, shapes, 8).flash_attn_type == C.LLAMA_FLASH_ATTN_TYPE_DISABLED


@pytest.mark.parametrize("values, message", [
    ({"cache_type_k": "q9"}, 'cache_type_k must be one of "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", '
                             '"q5_1", got \'q9\''),
    ({"flash_attn": "yes"}, 'flash_attn must be one of "auto", "on", "off", got \'yes\''),
    ({"cache_type_v": "q8_0", "flash_attn": "off"},
     'cache_type_v must be f16 or bf16 when flash_attn is "off" (llama.cpp keeps a quantized V cache only with '
     "flash attention), got 'q8_0'"),
    ({"deterministic": True, "cache_type_k": "q8_0"}, 'cache_type_k must be "f16" when deterministic is on, '
                                                      "got 'q8_0'"),
    ({"deterministic": True, "cache_type_v": "bf16"}, 'cache_type_v must be "f16" when deterministic is on, '
                                                      "got 'bf16'"),
    ({"deterministic": True, "flash_attn": "on"}, 'flash_attn must be "auto" or "off" when deterministic is on '
                                                  "(it runs with flash attention off), got 'on'"),
])
def test_settings_llama_cpp_or_deterministic_mode_cannot_run_are_one_line(values, message):
    with pytest.raises(InvalidRequest) as info:
        EngineConfig.from_dict(values)
    assert str(info.value) == message


def test_a_quantized_key_cache_without_flash_attention_is_allowed():
    config = EngineConfig.from_dict({"cache_type_k": "q8_0", "flash_attn": "off"})
    assert cparams_of(config).flash_attn_type == C.LLAMA_FLASH_ATTN_TYPE_DISABLED


@pytest.mark.parametrize("args, line", [
    (["--cache-type-v", "q4_0", "--flash-attn", "off"], "llamabatch: error: cache_type_v must be f16 or bf16 when "
                                                        'flash_attn is "off"'),
    (["-ctk", "q3"], 'llamabatch: error: cache_type_k must be one of "f16", "bf16", "q8_0"'),
    (["--deterministic", "-ctv", "q8_0"], 'llamabatch: error: cache_type_v must be "f16" when deterministic is on'),
])
def test_the_commands_refuse_them_in_one_line_before_an_engine_starts(args, line):
    out = invoke(["run", "-", "--n-parallel", "2", *args], '{"prompt": "hi"}\n', runner=runner_for())
    assert out.exit_code == 2
    assert out.stderr.startswith(line) and out.stderr.count("\n") == 1
    assert out.engines == []  # refused while resolving the settings: nothing was built


def test_config_file_values_are_checked_where_they_are_written(clean_env):
    (clean_env / "llamabatch.toml").write_text('cache_type_v = "q8"\n')
    out = invoke(["run", "-", "--n-parallel", "2"], '{"prompt": "hi"}\n', runner=runner_for())
    assert out.exit_code == 2
    assert "llamabatch.toml:1" in out.stderr and "cache_type_v" in out.stderr and '"q8_0"' in out.stderr
