"""CLI flags take their defaults from the config dataclasses: one default, one place."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import pytest

from argus.cli.defaults import config_default
from argus.cli.main import build_parser
from argus.drill import Drill
from argus.processor import HangConfig, ProcessorConfig
from argus.processor.assembler import WINDOW_TIMEOUT_S, WindowAssembler
from argus.sim import SimConfig
from argus.store import WINDOW_STEPS
from argus.tsdb import RemoteWriteConfig

pytestmark = pytest.mark.parallel_ok


@dataclass
class _Config:
    plain: int = 3
    made: list[int] = field(default_factory=lambda: [1, 2])


def _subparser(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _defaults(*names: str) -> dict[str, object]:
    return {a.dest: a.default for a in _subparser(*names)._actions}


def test_config_default_reads_a_default_and_calls_a_factory():
    assert config_default(_Config, "plain") == 3
    assert config_default(_Config, "made") == [1, 2]
    assert config_default(_Config, "made") is not config_default(_Config, "made")


def test_config_default_names_an_unknown_field_and_one_without_default():
    with pytest.raises(KeyError, match="no field 'missing'"):
        config_default(_Config, "missing")

    @dataclass
    class NoDefault:
        x: int

    with pytest.raises(TypeError, match="NoDefault.x has no default"):
        config_default(NoDefault, "x")


def test_window_defaults_are_defined_once():
    assert config_default(ProcessorConfig, "window_steps") == WINDOW_STEPS == config_default(SimConfig, "window_steps")
    assert config_default(ProcessorConfig, "window_timeout_s") == WINDOW_TIMEOUT_S
    assembler = WindowAssembler()
    assert (assembler.window_steps, assembler.timeout_s) == (WINDOW_STEPS, WINDOW_TIMEOUT_S)


def test_processor_flags_default_to_the_processor_config(monkeypatch):
    monkeypatch.delenv("ARGUS_HANG_MIN_S", raising=False)
    monkeypatch.delenv("ARGUS_HANG_STEP_FACTOR", raising=False)
    flags = _defaults("processor")
    config = ProcessorConfig(store="unused")
    assert flags["window_steps"] == config.window_steps
    assert flags["window_timeout"] == config.window_timeout_s
    assert flags["max_buffered_events"] == config.max_buffered_events
    assert flags["max_pending_frame_mb"] * (1 << 20) == config.max_pending_frame_bytes
    assert flags["evidence_interval"] == config.evidence_interval_s
    assert flags["evidence_max_mb"] * (1 << 20) == config.evidence_max_bytes
    assert flags["evidence_max_age_h"] * 3600 == config.evidence_max_age_s
    assert (flags["stack_hz"], flags["suspect_stack_hz"]) == (config.stack_hz, config.suspect_stack_hz)
    assert flags["hw_interval"] == config.hw_interval_s
    assert (flags["hang_min_s"], flags["hang_step_factor"]) == (HangConfig().min_s, HangConfig().step_factor)
    remote = RemoteWriteConfig(url="http://127.0.0.1:1/api/v1/write")
    assert (flags["remote_write_queue"], flags["remote_write_max_backoff"], flags["remote_write_heartbeat"]) == (
        remote.queue_windows, remote.max_backoff_s, remote.heartbeat_s)
    assert _defaults("run")["window_steps"] == config.window_steps


def test_help_shows_the_config_defaults():
    text = " ".join(_subparser("processor").format_help().split())
    assert f"steps per window (default {WINDOW_STEPS})" in text
    assert f"(default {RemoteWriteConfig.__dataclass_fields__['heartbeat_s'].default:g})" in text
    assert f"(default $ARGUS_HANG_MIN_S or {HangConfig().min_s:g})" in text
    assert f"(default $ARGUS_HANG_MIN_S or {HangConfig().min_s:g})" in " ".join(
        _subparser("run").format_help().split())


def test_simulate_and_drill_flags_default_to_their_configs():
    sim, config = _defaults("simulate"), SimConfig()
    for flag in ("ranks", "steps", "seed", "gpus_per_host", "layers", "microbatches", "virtual_stages"):
        assert sim[flag] == getattr(config, flag), flag
    drill = _defaults("drill")
    for flag, name in (("rank", "rank"), ("hosts", "hosts"), ("rate", "rate"), ("after_steps", "after_steps"),
                       ("duration", "duration_s"), ("hang_min_s", "hang_min_s"), ("timeout", "timeout_s")):
        assert drill[flag] == config_default(Drill, name), flag


def test_the_healthchecks_measure_again_pauses_are_the_librarys():
    from argus.healthcheck import AGAIN_PAUSES_S

    (again,) = [a for a in _subparser("healthcheck")._actions if a.dest == "again_after"]
    assert again.default is None  # the library's default is taken …
    assert "default: " + ",".join(f"{x:g}" for x in AGAIN_PAUSES_S) + " " in again.help  # … and said
