"""--watchdog and --drain-timeout: flag > the command's config table > the default (llamabatch/settings/time_bounds.py)."""
from __future__ import annotations

import inspect

import pytest

from llamabatch.settings.time_bounds import DEFAULT_DRAIN_TIMEOUT_S, TimeBounds, time_bounds
from llamabatch.supervised.engine import SupervisedEngine
from llamabatch.supervised.watchdog import DEFAULT_FLOOR_S

from cli_harness import invoke


@pytest.fixture(autouse=True)
def clean_env(settings_sandbox):
    return settings_sandbox  # conftest.py: no outside LLAMABATCH_*, an empty config dir, cwd in tmp


def test_defaults_then_the_commands_table_then_the_flag(clean_env):
    # set nowhere: None, which the supervised engine takes as its own default floor
    assert time_bounds("run", None, None) == TimeBounds(None, DEFAULT_DRAIN_TIMEOUT_S)
    assert inspect.signature(SupervisedEngine).parameters["watchdog_s"].default == DEFAULT_FLOOR_S
    (clean_env / "llamabatch.toml").write_text('[run]\nwatchdog = 15\ndrain_timeout = 2.5\n'
                                               '[serve-stdin]\nwatchdog = 0\n')
    assert time_bounds("run", None, None) == TimeBounds(15.0, 2.5)
    assert time_bounds("serve-stdin", None, None) == TimeBounds(0.0, DEFAULT_DRAIN_TIMEOUT_S)
    assert time_bounds("run", 7.0, 0.0) == TimeBounds(7.0, 0.0)


def test_a_job_reads_its_bounds_from_run_with_its_other_settings(clean_env, tmp_path):
    from llamabatch.jobs.job_spec import JobHost, job_settings
    from child_tools import fake_gguf

    model = fake_gguf(tmp_path)
    host = JobHost()
    spec, _resolved = job_settings("in.jsonl", None, {"model": model}, host)
    assert spec.bounds == TimeBounds(None, DEFAULT_DRAIN_TIMEOUT_S)
    (clean_env / "llamabatch.toml").write_text('[run]\nwatchdog = 15\ndrain_timeout = 2.5\n')
    spec, _resolved = job_settings("in.jsonl", None, {"model": model}, host)
    assert spec.bounds == TimeBounds(15.0, 2.5)
    spec, _resolved = job_settings("in.jsonl", None, {"model": model, "watchdog": 7.0, "drain_timeout": 0.0}, host)
    assert spec.bounds == TimeBounds(7.0, 0.0)


@pytest.mark.parametrize("value", ["-1", '"soon"', "true"])
def test_a_bad_value_in_the_file_is_one_line_and_exit_2(clean_env, value):
    (clean_env / "llamabatch.toml").write_text(f"[run]\ndrain_timeout = {value}\n")
    result = invoke(["run", "-", "--n-parallel", "1"], input="hi\n")
    assert result.exit_code == 2
    assert "drain_timeout" in result.stderr and "seconds" in result.stderr and "Traceback" not in result.stderr


def test_a_negative_flag_is_refused_before_anything_runs():
    result = invoke(["run", "-", "--watchdog", "-3"], input="hi\n")
    assert result.exit_code == 2 and "--watchdog" in result.stderr
