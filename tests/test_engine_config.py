"""EngineConfig as the one owner of engine settings, and the seed rule shared with
SamplingParams. No model."""
from __future__ import annotations

import pytest

from llamabatch import EngineConfig, InvalidRequest, SamplingParams
from llamabatch.settings import config_file
from llamabatch.config import KEY_RULES
from llamabatch.params import LLAMA_RANDOM_SEED, random_seed
from llamabatch.core.scheduling.policies import POLICIES


def test_seed_0xffffffff_is_refused_because_llama_cpp_reads_it_as_random():
    assert LLAMA_RANDOM_SEED == 0xFFFFFFFF
    for bad in (0xFFFFFFFF, -1, 2**32, True):
        with pytest.raises(InvalidRequest, match="seed must be an integer in"):
            SamplingParams(seed=bad).validate()
    with pytest.raises(InvalidRequest, match="seed"):
        SamplingParams.from_dict({"seed": 4294967295})
    assert SamplingParams(seed=0xFFFFFFFE).validate().seed == 0xFFFFFFFE
    assert SamplingParams(seed=0).validate().seed == 0
    assert all(random_seed() != LLAMA_RANDOM_SEED for _ in range(100))


@pytest.mark.parametrize("changes, message", [
    ({"seed": -5}, "seed must be an integer in"),
    ({"seed": 0xFFFFFFFF}, "seed must be an integer in"),
    ({"seed": "7"}, "seed must be"),
    ({"max_queue": True}, "max_queue must be an integer >= 0"),
    ({"max_queue": -1}, "max_queue must be an integer >= 0"),
    ({"n_parallel": 0}, "n_parallel must be an integer >= 1 or \"auto\", got 0"),
    ({"policy": "fastest"}, "policy must be one of"),
    ({"cache_prompt": "yes"}, "cache_prompt must be true or false"),
    ({"n_parallel": 4, "n_batch": 2}, "n_batch must be an integer >= n_parallel (4), got 2"),
    ({"n_parallel": 4, "n_ctx": 32}, "n_ctx must be an integer >= 16 per slot (64 for 4 slots), got 32"),
])
def test_engine_config_validates_every_key_and_the_rules_between_keys(changes, message):
    with pytest.raises(InvalidRequest) as info:
        EngineConfig(**changes).validate()
    assert message in str(info.value)
    with pytest.raises(InvalidRequest) as info:
        EngineConfig.from_dict(changes)
    assert message in str(info.value)


def test_from_dict_builds_on_a_base_and_refuses_unknown_keys():
    base = EngineConfig(n_parallel=2, policy="balanced")
    got = EngineConfig.from_dict({"n_ctx": 1024, "seed": 7}, base)
    assert (got.n_parallel, got.policy, got.n_ctx, got.seed) == (2, "balanced", 1024, 7)
    assert EngineConfig.from_dict({}) == EngineConfig()
    with pytest.raises(InvalidRequest, match="unknown engine setting 'n_slots'"):
        EngineConfig.from_dict({"n_slots": 4})


def test_policy_names_come_from_the_policies_themselves():
    for name in POLICIES:
        assert EngineConfig(policy=name).validate().policy == name
    with pytest.raises(InvalidRequest) as info:
        EngineConfig(policy="x").validate()
    assert all(f'"{name}"' in str(info.value) for name in POLICIES)


def test_the_config_file_takes_its_engine_keys_and_rules_from_engine_config():
    # one owner: the file's rule for a key is EngineConfig's rule object itself
    for key, rule in config_file.ENGINE_RULES.items():
        assert rule is KEY_RULES[key], key
    # model_name is not a file key: a [models] alias names the model; reserved_slots: serve's
    # --online-slots sets it
    assert set(KEY_RULES) - set(config_file.ENGINE_RULES) == {"seed", "max_queue", "model_name", "reserved_slots"}
    assert config_file.COMMAND_RULES["serve-stdin"]["max_queue"] is KEY_RULES["max_queue"]
    assert "seed" in config_file.SAMPLING_KEYS
    # and so a file says what EngineConfig says
    with pytest.raises(config_file.ConfigFileError, match=r'x.toml:1: n_parallel: must be an integer >= 1 or "auto", got 0'):
        config_file.parse_text("n_parallel = 0\n", "x.toml")
    with pytest.raises(config_file.ConfigFileError, match=r"\[serve-stdin\] max_queue: must be an integer >= 0"):
        config_file.parse_text("[serve-stdin]\nmax_queue = true\n", "x.toml")
