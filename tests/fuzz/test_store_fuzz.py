"""Damaged stores against ``argus diagnose``, ``argus info`` and ``argus report``.

One small simulated store (a compute straggler on ranks the truth names) is copied and damaged
in every way a crash, a full disk or a careless hand can: files and whole tables deleted,
files truncated at random offsets or zero bytes long, bytes flipped inside Parquet pages,
windows removed from the middle, ``attempt.json`` and the store manifest missing, corrupt
or foreign, temp leftovers, an uncommitted window, FIFOs and symlinks named ``*.parquet``,
stray files, a step number near 2⁶³, a store that cannot be written. The corpus is generated
from a fixed seed. All cases run in one child under an address-space limit, each under its
own deadline, through the CLI entry point as a user would call it.

Asserted for every case and command: no traceback, no hang, bounded memory, and an exit
code that is 0 (a diagnosis), 1 (``diagnose``: nothing to diagnose) or 2 (a clear one-line
``argus: error: …`` naming what is wrong). For damage that leaves the faulty windows, the
diagnosis must still name the injected culprits.

``python tests/fuzz/test_store_fuzz.py`` prints each case's outcome.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

#: Address space of the child running the corpus. Python + pyarrow + DuckDB map ~1.5 GB of
#: address space before doing anything; a small store needs little more.
MEM_MB = 4096
#: Peak resident memory of the child over the whole corpus. A clean run of this store peaks
#: near 200 MB; a blow-up (a window list over 2⁶³ steps) would pass this long before the limit.
MAX_PEAK_MB = 800
#: Per-command deadline in the child: a clean diagnosis of this store takes ~1.5 s; a FIFO
#: opened for reading would block forever.
CASE_TIMEOUT_S = 30
#: Cases that also render the HTML report (each costs a second diagnosis).
REPORT_CASES = ("pristine", "no_steps", "attempt_json_foreign", "uncommitted_window", "huge_step", "read_only")

_SCENARIO = dict(ranks=8, steps=16, seed=0, layers=1, microbatches=4)

_CHILD = r"""
import contextlib, io, json, signal, sys, time, traceback
from argus.cli.main import main

class Deadline(Exception):
    pass

def _alarm(signum, frame):
    raise Deadline()

signal.signal(signal.SIGALRM, _alarm)
cases = json.load(open(CASES))
out = []
for case in cases:
    for argv in case["commands"]:
        so, se = io.StringIO(), io.StringIO()
        t = time.perf_counter()
        rc, tb = None, ""
        signal.alarm(TIMEOUT)
        try:
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                rc = main(argv)
        except Deadline:
            rc, tb = "hang", "deadline passed"
        except SystemExit as e:
            rc = e.code
        except BaseException:
            rc, tb = "raised", traceback.format_exc()
        finally:
            signal.alarm(0)
        culprits = None
        if argv[0] == "diagnose" and "--json" in argv and rc == 0:
            try:
                doc = json.loads(so.getvalue())
                culprits = [sorted(i["culprit_ranks"]) for i in doc["incidents"] if i["class"] == FAULT]
            except ValueError:
                culprits = "bad json"
        out.append({"case": case["name"], "cmd": argv[0], "rc": rc, "traceback": tb, "s": time.perf_counter() - t,
                    "stderr": se.getvalue()[-600:], "culprits": culprits, "expect": case["expect_fault"]})
print(json.dumps(out))
"""


# -- damage ------------------------------------------------------------------------------------
def _attempt(store: Path) -> Path:
    return next((store / "runs").iterdir()).joinpath("0")


def _parquet(store: Path) -> list[Path]:
    return sorted(p for p in _attempt(store).rglob("*.parquet") if p.is_file())


def _delete_files(store: Path, rng: random.Random) -> None:
    for f in rng.sample(_parquet(store), 6):
        f.unlink()


def _truncate(store: Path, rng: random.Random) -> None:
    f = rng.choice(_parquet(store))
    data = f.read_bytes()
    f.write_bytes(data[: rng.randrange(len(data))])


def _zero_byte(store: Path, rng: random.Random) -> None:
    rng.choice(_parquet(store)).write_bytes(b"")


def _flip_bytes(store: Path, rng: random.Random) -> None:
    for f in rng.sample(_parquet(store), 3):
        data = bytearray(f.read_bytes())
        for _ in range(16):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        f.write_bytes(bytes(data))


def _drop_table(table: str) -> Callable[[Path, random.Random], None]:
    def damage(store: Path, rng: random.Random) -> None:
        shutil.rmtree(_attempt(store) / table)
    damage.__name__ = f"no_{table}"
    return damage


def _middle_windows_gone(store: Path, rng: random.Random) -> None:
    for f in _parquet(store):
        if 10 <= int(f.name.split("-")[0]) <= 12 and f.parent.parent.name in ("steps", "phases", "stacks", "hw"):
            f.unlink()


def _meta(content: bytes | None, name: str = "attempt.json") -> Callable[[Path, random.Random], None]:
    def damage(store: Path, rng: random.Random) -> None:
        path = _attempt(store) / name if name == "attempt.json" else store / name
        path.unlink()
        if content is not None:
            path.write_bytes(content)
    return damage


def _foreign_meta(store: Path, rng: random.Random) -> None:
    path = _attempt(store) / "attempt.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "run_id": "someone-else"}))


def _tmp_leftovers(store: Path, rng: random.Random) -> None:
    for f in rng.sample(_parquet(store), 4):
        (f.parent / f".tmp-deadbeef-{f.name}").write_bytes(f.read_bytes()[:100])


def _uncommitted_window(store: Path, rng: random.Random) -> None:
    for table in ("steps", "phases"):
        src = sorted((_attempt(store) / table / "sim").iterdir())[-1]
        shutil.copy(src, src.parent.parent / "sim" / "000000099-u0badf00d.parquet")


def _fifo(store: Path, rng: random.Random) -> None:
    os.mkfifo(_attempt(store) / "steps" / "sim" / "000000050-deadbeef.parquet")
    os.mkfifo(_attempt(store) / "phases" / "sim" / "000000050-deadbeef.parquet")


def _symlinks(store: Path, rng: random.Random) -> None:
    os.symlink("/dev/zero", _attempt(store) / "steps" / "sim" / "000000051-deadbeef.parquet")
    os.symlink("/etc", _attempt(store) / "hw" / "elsewhere")


def _stray_files(store: Path, rng: random.Random) -> None:
    (_attempt(store) / "steps" / "sim" / "notes.txt").write_text("hello")
    (_attempt(store) / "phases" / "README").write_text("not a writer directory")
    (_attempt(store) / "unexpected-dir").mkdir()


def _empty_attempt(store: Path, rng: random.Random) -> None:
    for p in _attempt(store).iterdir():
        if p.is_dir():
            shutil.rmtree(p)


def _huge_step(store: Path, rng: random.Random) -> None:
    import numpy as np

    from argus.store import Store

    w = Store.open(store).attempt().writer("evil")
    r, big = np.arange(8), 2**63 - 1
    w.write("steps", {"rank": r, "step": np.full(8, big), "start_ns": r, "end_ns": r + 10}, window=0)
    w.write("phases", {"rank": r, "step": np.full(8, big), "microbatch": np.full(8, -1), "name": ["x"] * 8,
                       "category": ["compute"] * 8, "group_kind": [""] * 8, "start_ns": r, "dur_ns": np.full(8, 5),
                       "wait_ns": np.full(8, -1)}, window=0)


def _read_only(store: Path, rng: random.Random) -> None:
    (_attempt(store) / "incidents").write_text("")  # root ignores modes: this makes writing incidents fail too
    for d, _, _ in os.walk(store):
        os.chmod(d, 0o555)


# (name, damage, the injected fault is still in the surviving windows)
CASES: list[tuple[str, Callable[[Path, random.Random], None], bool]] = [
    ("pristine", lambda s, r: None, True),
    ("delete_random_files", _delete_files, False),
    ("truncate_a", _truncate, False),
    ("zero_byte_a", _zero_byte, False),
    ("flip_bytes", _flip_bytes, False),
    ("middle_windows_gone", _middle_windows_gone, True),
    *[(f"no_{t}", _drop_table(t), t in ("hw", "stacks", "kernel_sketches", "kernel_summaries", "topology"))
      for t in ("steps", "phases", "topology", "kernel_summaries", "hw")],
    ("empty_attempt", _empty_attempt, False),
    ("attempt_json_missing", _meta(None), False),
    ("attempt_json_empty", _meta(b""), False),
    ("attempt_json_garbage", _meta(b"\x00\xff{[not json"), False),
    ("attempt_json_deep", _meta(b"[" * 200_000), False),
    ("attempt_json_foreign", _foreign_meta, False),
    ("attempt_json_fifo", lambda s, r: (_meta(None)(s, r), os.mkfifo(_attempt(s) / "attempt.json")), False),
    ("manifest_corrupt", _meta(b'{"format": "argus-store", "schema_version": "1"', "argus-store.json"), False),
    ("tmp_leftovers", _tmp_leftovers, True),
    ("uncommitted_window", _uncommitted_window, True),
    ("fifo_parquet", _fifo, True),
    ("symlinks", _symlinks, True),
    ("stray_files", _stray_files, True),
    ("huge_step", _huge_step, True),
    ("read_only", _read_only, True),
]


def build_corpus(root: Path, seed: int = 13) -> list[dict]:
    """Simulate the store once, then write one damaged copy per case under ``root``."""
    from argus.sim import SimConfig, simulate_to_store

    pristine = root / "pristine-src"
    res = simulate_to_store(SimConfig(**_SCENARIO), "compute_straggler", pristine, baseline=False)
    fault = res.truth["faults"][0]
    rng = random.Random(seed)
    cases = []
    for name, damage, keeps_fault in CASES:
        store = root / name
        shutil.copytree(pristine, store)
        damage(store, rng)
        commands = [["diagnose", str(store), "--json"] + ([] if name == "read_only" else ["--no-store"]),
                    ["info", str(store)]]
        if name in REPORT_CASES:
            commands.append(["report", str(store), "--out", str(root / f"{name}.html")])
        cases.append({"name": name, "commands": commands, "expect_fault": sorted(fault["culprit_ranks"]) if keeps_fault
                      else None})
    return cases


def run_corpus(root: Path) -> tuple[list[dict], float]:
    from tests.fuzz.bounded import run_bounded

    cases = build_corpus(root)
    (root / "cases.json").write_text(json.dumps(cases))
    code = (f"CASES = {str(root / 'cases.json')!r}\nTIMEOUT = {CASE_TIMEOUT_S}\nFAULT = 'compute_straggler'\n"
            + _CHILD)
    res = run_bounded(code, mem_mb=MEM_MB, timeout_s=CASE_TIMEOUT_S * 4 + 60,
                      cwd=Path(__file__).resolve().parents[2])
    assert not res.killed and not res.traceback, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1]), res.peak_mb


def _problems(results: list[dict]) -> list[str]:
    bad = []
    for r in results:
        where = f"{r['case']}/{r['cmd']}"
        if r["traceback"] or r["rc"] in ("raised", "hang"):
            bad.append(f"{where}: {r['rc']}: {r['traceback'][-800:]}")
        elif r["rc"] not in (0, 1, 2) or (r["rc"] == 1 and r["cmd"] != "diagnose"):
            bad.append(f"{where}: exit {r['rc']}")
        elif r["rc"] == 2 and "argus: error: " not in r["stderr"]:
            bad.append(f"{where}: exit 2 without a clear error: {r['stderr'][-300:]}")
        elif "Traceback" in r["stderr"]:
            bad.append(f"{where}: traceback on stderr")
        if r["cmd"] == "diagnose" and r["expect"] is not None and r["expect"] not in (r["culprits"] or []):
            bad.append(f"{where}: lost the injected fault {r['expect']} (found {r['culprits']}, exit {r['rc']}: "
                       f"{r['stderr'][-300:]})")
    return bad


def test_damaged_stores_give_a_diagnosis_or_a_clear_error(tmp_path):
    results, peak_mb = run_corpus(tmp_path)
    for d, _, _ in os.walk(tmp_path):  # the read-only case's directories, for pytest's cleanup
        os.chmod(d, 0o755)
    assert len(results) >= 2 * len(CASES)
    problems = _problems(results)
    assert not problems, "\n".join(problems)
    assert peak_mb < MAX_PEAK_MB, f"peak RSS {peak_mb:.0f} MB"
    by = {(r["case"], r["cmd"]): r for r in results}
    assert by[("attempt_json_foreign", "diagnose")]["rc"] == 2 and "foreign" in by[("attempt_json_foreign",
                                                                                     "diagnose")]["stderr"]
    assert "not stored" in by[("read_only", "diagnose")]["stderr"]
    assert by[("empty_attempt", "diagnose")]["rc"] == 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    with tempfile.TemporaryDirectory() as d:
        results, peak = run_corpus(Path(d))
        for d_, _, _ in os.walk(d):
            os.chmod(d_, 0o755)
        for r in results:
            print(f"{r['case']:24} {r['cmd']:8} exit {r['rc']!s:6} {r['s']:5.1f} s  "
                  f"{(r['traceback'] or r['stderr']).strip().splitlines()[-1:] if (r['traceback'] or r['stderr']) else ''}")
        print(f"peak {peak:.0f} MB; problems: {_problems(results) or 'none'}")
