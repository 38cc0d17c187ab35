"""Evidence retention: sizes and ages with an injected clock; foreign files are never touched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from argus.errors import ConfigError
from argus.evidence import RetentionPolicy, enforce_retention
from argus.evidence.retention import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES, ENV_MAX_AGE_S, ENV_MAX_BYTES, STALE_TMP_S
from argus.store.files import TMP_PREFIX

NOW = 1_800_000_000.0


def make(path: Path, size: int, age_s: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (NOW - age_s, NOW - age_s))
    return path


def names(paths) -> list[str]:
    return sorted(p.name for p in paths)


def test_oldest_files_go_first_until_under_the_byte_budget(tmp_path: Path):
    for i, age in enumerate([50, 40, 30, 20, 10]):
        make(tmp_path / f"w{i}.pftrace", 100, age)
    removed = enforce_retention(tmp_path, max_bytes=250, max_age_s=None, now=NOW)
    assert names(removed) == ["w0.pftrace", "w1.pftrace", "w2.pftrace"]
    assert names(tmp_path.iterdir()) == ["w3.pftrace", "w4.pftrace"]


def test_budget_exactly_met_removes_nothing(tmp_path: Path):
    for i in range(3):
        make(tmp_path / f"w{i}.pftrace", 100, 10 + i)
    assert enforce_retention(tmp_path, max_bytes=300, max_age_s=None, now=NOW) == []


def test_files_older_than_max_age_are_removed(tmp_path: Path):
    make(tmp_path / "old.pftrace", 10, 3 * 3600)
    make(tmp_path / "edge.pftrace", 10, 3600)  # exactly max_age_s old: kept
    make(tmp_path / "new.pftrace", 10, 60)
    removed = enforce_retention(tmp_path, max_bytes=None, max_age_s=3600, now=NOW)
    assert names(removed) == ["old.pftrace"]


def test_both_limits_apply_together_and_none_disables_them(tmp_path: Path):
    make(tmp_path / "a.pftrace", 100, 7200)
    make(tmp_path / "b.pftrace", 100, 30)
    make(tmp_path / "c.pftrace", 100, 20)
    assert enforce_retention(tmp_path, max_bytes=None, max_age_s=None, now=NOW) == []
    removed = enforce_retention(tmp_path, max_bytes=150, max_age_s=3600, now=NOW)
    assert names(removed) == ["a.pftrace", "b.pftrace"]


def test_subdirectories_count_and_only_matching_files_are_touched(tmp_path: Path):
    make(tmp_path / "host-a" / "w0.pftrace", 100, 100)
    make(tmp_path / "host-b" / "deep" / "w1.pftrace", 100, 90)
    make(tmp_path / "host-a" / "w2.pftrace", 100, 80)
    foreign = [make(tmp_path / "notes.txt", 10_000, 10_000_000), make(tmp_path / "host-a" / "w0.parquet", 500, 10**7),
               make(tmp_path / "host-b" / "trace.pftrace.gz", 500, 10**7)]
    (tmp_path / "dir.pftrace").mkdir()  # a directory that matches the pattern is not a file
    os.symlink(foreign[0], tmp_path / "link.pftrace")  # nor is a symlink
    removed = enforce_retention(tmp_path, max_bytes=100, max_age_s=1, now=NOW)
    assert names(removed) == ["w0.pftrace", "w1.pftrace", "w2.pftrace"]
    assert all(p.exists() for p in foreign)
    assert (tmp_path / "dir.pftrace").is_dir() and (tmp_path / "link.pftrace").is_symlink()
    assert (tmp_path / "host-b" / "deep").is_dir()  # directories are left in place


def test_custom_pattern(tmp_path: Path):
    make(tmp_path / "a.pftrace", 100, 100)
    make(tmp_path / "b.json.gz", 100, 100)
    removed = enforce_retention(tmp_path, max_bytes=0, max_age_s=None, now=NOW, pattern="*.json.gz")
    assert names(removed) == ["b.json.gz"] and (tmp_path / "a.pftrace").exists()


def test_files_vanishing_concurrently_are_tolerated(tmp_path: Path, monkeypatch):
    for i in range(4):
        make(tmp_path / f"w{i}.pftrace", 100, 100 - i)
    real_unlink = os.unlink

    def racing_unlink(path):
        if path.endswith("w0.pftrace"):
            real_unlink(path)  # somebody else deleted it first
            raise FileNotFoundError(path)
        real_unlink(path)

    monkeypatch.setattr(os, "unlink", racing_unlink)
    removed = enforce_retention(tmp_path, max_bytes=200, max_age_s=None, now=NOW)
    assert names(removed) == ["w1.pftrace"]  # w0 is gone too (not by us), and that freed its bytes
    assert names(tmp_path.iterdir()) == ["w2.pftrace", "w3.pftrace"]


def test_missing_directory_removes_nothing(tmp_path: Path):
    assert enforce_retention(tmp_path / "absent", max_bytes=0, max_age_s=0, now=NOW) == []


def test_temp_files_of_writes_in_progress_are_skipped_but_stale_ones_removed(tmp_path: Path):
    live = make(tmp_path / f"{TMP_PREFIX}0123abcd-w9.pftrace", 1000, 5)
    stale = make(tmp_path / f"{TMP_PREFIX}deadbeef-w1.pftrace", 1000, STALE_TMP_S + 1)
    make(tmp_path / "w0.pftrace", 100, 50)
    removed = enforce_retention(tmp_path, max_bytes=100, max_age_s=None, now=NOW)
    assert removed == [stale] and live.exists()


def test_policy_defaults_validation_and_environment():
    policy = RetentionPolicy()
    assert (policy.max_bytes, policy.max_age_s, policy.pattern) == (512 * 1024 ** 2, 24 * 3600.0, "*.pftrace")
    assert (DEFAULT_MAX_BYTES, DEFAULT_MAX_AGE_S) == (policy.max_bytes, policy.max_age_s)
    for bad in ({"max_bytes": -1}, {"max_bytes": 1.5}, {"max_bytes": True}, {"max_age_s": -1.0},
                {"max_age_s": float("nan")}, {"pattern": ""}, {"pattern": "a/*.pftrace"}):
        with pytest.raises(ConfigError):
            RetentionPolicy(**bad)
    env = {ENV_MAX_BYTES: "1000", ENV_MAX_AGE_S: "none"}
    assert RetentionPolicy.from_env(env) == RetentionPolicy(max_bytes=1000, max_age_s=None)
    assert RetentionPolicy.from_env(env, max_bytes=5).max_bytes == 5  # explicit beats environment
    assert RetentionPolicy.from_env({}) == RetentionPolicy()
    with pytest.raises(ConfigError, match="max_byte"):
        RetentionPolicy.from_env({}, max_byte=5)
    with pytest.raises(ConfigError, match=ENV_MAX_BYTES):
        RetentionPolicy.from_env({ENV_MAX_BYTES: "lots"})


def test_policy_enforce_uses_its_limits(tmp_path: Path):
    make(tmp_path / "a.pftrace", 100, 10)
    make(tmp_path / "b.pftrace", 100, 5)
    assert names(RetentionPolicy(max_bytes=100, max_age_s=None).enforce(tmp_path, now=NOW)) == ["a.pftrace"]
