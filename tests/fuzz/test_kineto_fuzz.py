"""Hostile Kineto files beside good ranks: ``argus ingest kineto`` loses only what is bad.

A generated corpus (fixed seed, so CI sees the same files every run): the cases reported in
issue 13 written out by hand, plus mutations of a real trace — truncation at random offsets,
byte flips, type swaps of ``ts``/``dur``/``stream``, deep nesting and huge numbers spliced in.
Each hostile file claims its own rank so none collides with another. One child imports the
whole directory under a memory limit; the store is then read back and every value checked.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

from argus.kineto import read_trace
from argus.kineto.limits import MAX_STEP
from tests.fuzz.bounded import run_bounded

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
GOOD = ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz")  # ranks 0 and 1 of a 128-rank job
WORLD = 128
#: Peak resident memory allowed for importing the corpus (~57 files, 2 good ranks). Python with
#: pyarrow and DuckDB starts near 120 MB; before the guard, the deep-nesting file alone took 23 GB.
PEAK_MB = 1024
#: The 200,000-deep file alone: what starting Python and reading one small file costs.
DEEP_PEAK_MB = 300
SEED = 13


def _step(n, ts=0, dur=100):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur}


def _kernel(**over):
    ev = {"ph": "X", "cat": "kernel", "name": "k", "ts": 10, "dur": 5, "args": {"stream": 7, "device": 0}}
    for key, value in over.items():
        (ev["args"] if key in ("stream", "device") else ev)[key] = value
    return ev


def _doc(rank: int, events: list, **top) -> bytes:
    dist = top.pop("distributedInfo", {"rank": rank, "world_size": WORLD})
    return json.dumps({"distributedInfo": dist, **top, "traceEvents": [_step(1), _kernel(), *events]}).encode()


def _deep(depth: int) -> bytes:
    event = '{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":1,"args":' + '{"a":' * depth + "1" + "}" * depth + "}"
    return ('{"traceEvents":[' + json.dumps(_step(1)) + "," + event + "]}").encode()


def _named_cases() -> dict[str, tuple[bytes, bool]]:
    """Issue 13's cases: file body, and whether the whole file must fail (else it imports, minus
    the bad events)."""
    good_gz = gzip.compress(_doc(0, []))
    return {
        "deep_args": (_deep(200_000), True),
        "deep_list": (b'{"traceEvents":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}", True),
        "long_string": (_doc(0, [_kernel(name="x" * (2 << 20))]), True),
        "huge_step": (_doc(0, [_step(9223372036854775807, ts=200)]), False),
        "step_5000_digits": (_doc(0, [{**_step(1), "name": "ProfilerStep#" + "9" * 5000}]), False),
        "kernel_name_int": (_doc(0, [_kernel(name=12345)]), False),
        "kernel_name_list": (_doc(0, [_kernel(name=[1, 2])]), False),
        "base_1e300": (_doc(0, [], baseTimeNanoseconds=1e300), True),
        "base_negative": (_doc(0, [], baseTimeNanoseconds=-5), True),
        "dur_negative": (_doc(0, [_kernel(dur=-50)]), False),
        "dur_1e300": (_doc(0, [_kernel(dur=1e300)]), False),
        "ts_1e300": (_doc(0, [_kernel(ts=1e300)]), False),
        "ts_bool": (_doc(0, [_kernel(ts=True)]), False),
        "ts_string": (_doc(0, [_kernel(ts="10")]), False),
        "stream_2_40": (_doc(0, [_kernel(stream=2**40)]), False),
        "stream_negative": (_doc(0, [_kernel(stream=-3)]), False),
        "device_2_40": (_doc(0, [_kernel(device=2**40)]), False),
        "rank_minus_1": (_doc(0, [], distributedInfo={"rank": -1, "world_size": WORLD}), False),
        "rank_true": (_doc(0, [], distributedInfo={"rank": True, "world_size": WORLD}), False),
        "world_10_7": (_doc(0, [], distributedInfo={"world_size": 10**7}), False),
        "microbatch_2_40": (_doc(0, [{"ph": "X", "cat": "user_annotation", "name": "a", "ts": 21, "dur": 1,
                                      "args": {"argus": {"microbatch": 2**40}}}]), False),
        "event_not_object": (_doc(0, [5, "x", None]), False),
        "nan_literal": (_doc(0, [_kernel()]).replace(b'"dur": 5', b'"dur": NaN', 1), True),
        "integer_past_int64": (_doc(0, []).replace(b'"ts": 10', b'"ts": 1' + b"0" * 40, 1), True),
        # yajl (ijson's C parser) refuses INT64_MIN when floats are decoded: a clear per-file error.
        "int64_min": (_doc(0, [_kernel(ts=-9223372036854775808)]), True),
        "duplicate_keys": (_doc(0, [_kernel()]).replace(b'"dur": 5,', b'"dur": 5, "dur": -9,', 1), False),
        "bom": (b"\xef\xbb\xbf" + _doc(0, []), False),
        "regex_bomb_name": (_doc(0, [{"ph": "X", "cat": "user_annotation", "name": "##" + " " * 50_000 + "x",
                                      "ts": 21, "dur": 1}]), False),
        "empty": (b"", True),
        "truncated": (_doc(0, [])[:-30], True),
        "gzip_truncated": (good_gz[: len(good_gz) // 2], True),
        "gzip_corrupt": (good_gz[:20] + bytes(b ^ 0x55 for b in good_gz[20:60]) + good_gz[60:], True),
    }


#: Values swapped in for a field: wrong types, out of range, or past what int32/int64 ns hold.
_SWAPS = [b'"x"', b"true", b"false", b"-1", b"1e300", b"null", b"[]", b"{}", b"-1e12", b"9223372036854775807",
          b"-9223372036854775807", b"1e308", b"-0.0", b"4e15", b"2147483648", b'"stream 7"', b'{"a": [1]}']
_FIELDS = [b'"ts": ', b'"dur": ', b'"stream": ', b'"device": ', b'"correlation": ', b'"name": ', b'"External id": ']


def _swap_values(text: bytes, rng: random.Random, start: int, count: int) -> bytes:
    """``count`` field values after ``start`` replaced by :data:`_SWAPS` (still valid JSON)."""
    decoder = json.JSONDecoder()
    body = text.decode()
    spots = sorted({m.end() for f in rng.sample(_FIELDS, 3) for m in re.finditer(re.escape(f.decode()), body)
                    if m.start() > start})
    for at in sorted(rng.sample(spots, min(count, len(spots))), reverse=True):  # from the end: offsets hold
        end = decoder.raw_decode(body, at)[1]
        body = body[:at] + rng.choice(_SWAPS).decode() + body[end:]
    return body.encode()


def _mutants(rng: random.Random, n: int) -> list[tuple[bytes, bool]]:
    """Mutations of a real rank's JSON, each given its own rank, and whether it is still valid
    JSON. Changes land after ``traceEvents`` so the rank and world size stay as written (two
    files claiming one rank is a deliberate whole-import error, tested elsewhere)."""
    text = gzip.decompress((DATA / GOOD[0]).read_bytes())
    events_at = text.index(b'"traceEvents"')
    out = []
    for i in range(n):
        how = i % 4
        if how == 0:  # truncation at a random offset
            body, valid = text[: rng.randrange(events_at, len(text))], False
        elif how == 1:  # byte flips
            flipped = bytearray(text)
            for _ in range(rng.randint(1, 40)):
                flipped[rng.randrange(events_at, len(flipped))] = rng.randrange(256)
            body, valid = bytes(flipped), False
        elif how == 2:  # type swaps and huge numbers in ts / dur / stream / device / names …
            body, valid = _swap_values(text, rng, events_at, rng.randint(1, 60)), True
        else:  # deep nesting spliced into an event's args
            at = text.index(b'"args": {', rng.randrange(events_at, len(text) // 2)) + len(b'"args": {')
            depth = rng.choice([65, 1000, 50_000])
            body, valid = text[:at] + b'"deep": ' + b"[" * depth + b"]" * depth + b", " + text[at:], False
        doc = body.replace(b'"rank": 0', b'"rank": %d' % (10 + i), 1)
        out.append((gzip.compress(doc, 1) if i % 2 else doc, valid))
    return out


def _corpus(d: Path) -> tuple[dict[str, bool | None], list[str]]:
    """Writes the corpus; returns {hostile file name: must fail (True), must import (False) or
    either (None)} and the good file names."""
    d.mkdir()
    for name in GOOD:
        (d / name).write_bytes((DATA / name).read_bytes())
    expected: dict[str, bool | None] = {}
    for i, (case, (body, fails)) in enumerate(_named_cases().items()):
        rank = 40 + i
        body = body.replace(b'"rank": 0', b'"rank": %d' % rank, 1)
        name = f"{case}_rank{rank}.json" + (".gz" if case.startswith("gzip") else "")
        (d / name).write_bytes(body)
        expected[name] = fails
    for i, (body, valid) in enumerate(_mutants(random.Random(SEED), 24)):
        name = f"mutant{i}_rank{10 + i}.json" + (".gz" if i % 2 else "")
        (d / name).write_bytes(body)
        expected[name] = None if not valid else False  # broken JSON may fail; swapped values must import
    return expected, list(GOOD)


_CHILD = """
import json, sys
from argus.cli.main import main
rc = main(["ingest", "kineto", sys.argv[1] if len(sys.argv) > 1 else {traces!r}, "--out", {store!r}, "--json"])
from argus.store import Store
a = Store.open({store!r}).attempt()
k, p, s = a.read("kernels").to_pylist(), a.read("phases").to_pylist(), a.read("steps").to_pylist()
per_rank = {{}}
for table, rows in (("kernels", k), ("phases", p), ("steps", s)):
    for r in rows:
        per_rank.setdefault(r["rank"], {{}}).setdefault(table, 0)
        per_rank[r["rank"]][table] += 1
print("SUMMARY " + json.dumps({{
    "rc": rc, "attempts": len(Store.open({store!r}).attempts()), "per_rank": per_rank,
    "min_kernel_dur": min((r["dur_ns"] for r in k), default=0),
    "min_phase_dur": min((r["dur_ns"] for r in p), default=0),
    "starts": [min(r["start_ns"] for r in k + p + s), max(r["start_ns"] for r in k + p + s)],
    "steps": [min(r["step"] for r in s), max(r["step"] for r in s)],
    "streams": [min(r["stream"] for r in k), max(r["stream"] for r in k)],
    "devices": [min(r["device"] for r in k), max(r["device"] for r in k)],
}}))
"""


def test_a_hostile_corpus_beside_two_good_ranks_imports_the_good_and_names_the_bad(tmp_path):
    expected, good = _corpus(tmp_path / "traces")
    store = tmp_path / "S"
    res = run_bounded(_CHILD.format(traces=str(tmp_path / "traces"), store=str(store)), mem_mb=3000, timeout_s=120)
    assert not res.traceback and not res.killed, res.stderr[-3000:]
    assert res.peak_mb < PEAK_MB, res.peak_mb
    report_text, summary_line = res.stdout.split("SUMMARY ", 1)
    report, summary = json.loads(report_text), json.loads(summary_line)
    assert summary["rc"] == 1 and f"of {len(expected) + len(good)} files not imported" in res.stderr

    imported = {Path(f["path"]).name: f for f in report["files"]}
    failed = {Path(f["path"]).name: f["problem"] for f in report["failures"]}
    for name, must_fail in expected.items():  # every hostile file is accounted for, by name
        assert (name in failed) != (name in imported), name
        if must_fail:
            assert name in failed and failed[name].startswith(str(tmp_path / "traces" / name)), name
        elif must_fail is False:  # valid JSON with bad values: imported, minus what is bad
            assert name in imported, (name, failed.get(name))
    for name, problem in failed.items():
        assert name in res.stderr and "Traceback" not in problem

    for rank, name in enumerate(good):  # both good ranks, with every event they hold
        want = read_trace(DATA / name)
        got = summary["per_rank"][str(rank)]
        assert (got["steps"], got["phases"], got["kernels"]) == (len(want.steps.step), len(want.phases), len(want.kernels))
        assert imported[name]["rejected"] == {}
    assert summary["attempts"] == 1
    assert set(map(int, summary["per_rank"])) == {f["rank"] for f in report["files"]}
    assert set(map(int, summary["per_rank"])) <= set(range(WORLD))

    # Nothing stored is out of range: no negative durations (-1 marks an unfinished phase), no
    # wrapped timestamps, steps within the limit, streams and devices as int32.
    assert summary["min_kernel_dur"] >= 0 and summary["min_phase_dur"] >= -1
    assert 0 <= summary["starts"][0] and summary["starts"][1] < 6_100_000_000_000_000_000
    assert 0 <= summary["steps"][0] and summary["steps"][1] <= MAX_STEP
    assert summary["streams"][0] >= -1 and summary["devices"][0] >= 0
    assert report["events_left_out"] > 0  # the bad events of files that imported were counted


def test_a_200000_deep_event_is_refused_in_bounded_memory(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_bytes(_deep(200_000))  # ~1.4 MB; drove the import to 23 GB before the guard
    res = run_bounded("from argus.cli.main import main\n"
                      f"raise SystemExit(main(['ingest', 'kineto', {str(path)!r}, '--out', {str(tmp_path / 'S')!r}]))",
                      mem_mb=3000, timeout_s=60)
    assert res.returncode == 2 and not res.traceback, res.stderr
    assert f"{path}: JSON nested deeper than 64 levels" in res.stderr
    assert "in the trace event starting at byte" in res.stderr
    assert res.peak_mb < DEEP_PEAK_MB, res.peak_mb
