"""Hostile clients against one real processor on a real unix socket.

The corpus is the issue's cases (each once killed the daemon or pinned memory) plus
generated ones: HELLO documents with a bad value in every field, mutated and random frames,
a valid HELLO followed by garbage batches, unfinished frames held open, a connection flood
past the descriptor limit, and rings whose file lies. After **every** hostile client a real
client connects, sends a step and waits for its FLUSH to be acknowledged (the window is on
disk); at the end the processor's peak RSS is under ``MAX_RSS_MB``, its status counts the
drops by reason and the store holds no attempt for a hostile run id.

``run_corpus`` is also a script entry point (``python tests/fuzz/test_wire_fuzz.py``) that
prints each case's outcome, so the same corpus can be run against an older tree.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from argus.wire import Msg, ProcessorClient
from argus.wire.protocol import DTYPES, HEADER, MAGIC, VERSION, encode_array, encode_json
from argus.wire.ring import RingWriter

#: The processor's peak resident memory after the whole corpus. Python + numpy + pyarrow +
#: DuckDB start at ~200 MB; before the limits, one case alone reached 950 MB.
MAX_RSS_MB = 600
#: The test processor's unfinished-frame budget (MiB): small, so a few held frames pass it.
PENDING_MB = 32
#: Descriptors the test processor may open: a flood of FLOOD connections exhausts them.
NOFILE = 200
FLOOD = 260
AS_LIMIT = 4 << 30  # address-space limit of the processor: a blow-up fails fast


def _frame(msg: int, payload: bytes, version: int = VERSION, magic: bytes = MAGIC, length: int | None = None) -> bytes:
    return HEADER.pack(magic, version, msg, len(payload) if length is None else length) + payload


def _raw_json(msg: Msg, text: str) -> bytes:
    return _frame(int(msg), text.encode())


def _hello_doc(**over: object) -> dict:
    doc = {"run_id": "evil", "attempt_id": "0", "rank": 0, "world_size": 1, "host": "node-0", "pid": os.getpid()}
    doc.update(over)
    return doc


def _hello(**over: object) -> bytes:
    return encode_json(Msg.HELLO, _hello_doc(**over))


def _steps(step: int) -> np.ndarray:
    rec = np.zeros(1, DTYPES[Msg.STEPS])
    rec["step"], rec["start_ns"], rec["end_ns"] = step, 1_000_000 * step, 1_000_000 * step + 500
    return rec


def _spread(n: int) -> np.ndarray:
    rec = np.zeros(n, DTYPES[Msg.STEPS])
    rec["step"] = np.arange(n) * 1000 + 10_000_000
    rec["end_ns"] = 1
    return rec


MIXED = _hello(run_id="mixed", rank=0, world_size=1)  # a valid HELLO, then garbage: a real attempt


def _cases() -> list[tuple[str, bytes]]:
    """(name, bytes the hostile client sends); every HELLO run id but "mixed" is hostile."""
    bad_values = {"NaN": "NaN", "inf": "1e999", "-inf": "-1e999", "true": "true", "false": "false", "null": "null",
                  "neg": "-1", "float": "0.5", "str": '"0"', "list": "[0]", "obj": "{}", "big": str(10 ** 30),
                  "huge-int": "9" * 5000}
    cases: list[tuple[str, bytes]] = []
    for field in ("rank", "world_size", "local_rank", "pid", "tid", "clock_offset_ns"):
        for label, text in bad_values.items():
            if field == "local_rank" and label in ("neg", "null"):
                continue  # -1 and null mean "unknown": valid
            if field in ("pid", "tid", "clock_offset_ns") and label in ("null",):
                continue
            if field == "clock_offset_ns" and label == "neg":
                continue
            doc = _hello_doc(**{"run_id": f"evil-{field}-{label}", "kernels": "cpu_ops", "tid": 1, field: "@X@"})
            text_doc = json.dumps(doc).replace('"@X@"', text)
            cases.append((f"HELLO {field}={label}", _raw_json(Msg.HELLO, text_doc)))
    for field in ("run_id", "attempt_id", "host", "layout", "order", "gpu_uuid", "ring", "kernels"):
        for label, value in (("int-list", [1]), ("obj", {"a": 1}), ("ctrl", "a\x1b[31mb"), ("long", "x" * 5000)):
            cases.append((f"HELLO {field}={label}", _hello(**{field: value, "run_id": f"evil-{field}-{label}"}
                                                          if field != "run_id" else {field: value})))
    cases += [
        ("HELLO world_size=10**7", _hello(run_id="evil-world7", world_size=10 ** 7)),
        ("HELLO world_size=1e15 (float)", _raw_json(Msg.HELLO, '{"run_id":"evil-w15","rank":0,"world_size":1e15}')),
        ("HELLO world_size=10**15 (int)", _hello(run_id="evil-w15i", world_size=10 ** 15)),
        ("HELLO rank=1e999", _raw_json(Msg.HELLO, '{"run_id":"evil-r999","rank":1e999,"world_size":2}')),
        ("HELLO local_rank=1e999", _raw_json(Msg.HELLO, '{"run_id":"evil-l999","rank":0,"world_size":2,'
                                                        '"local_rank":1e999}')),
        ("HELLO run id of 300 chars", _hello(run_id="e" * 300)),
        ("HELLO run id ../x", _hello(run_id="../evil")),
        ("HELLO run id .hidden", _hello(run_id=".evil")),
        ("HELLO attempt id a/b", _hello(run_id="evil-slash", attempt_id="a/b")),
        ("HELLO layout not dividing", _hello(run_id="evil-layout", layout="tp=3", world_size=4)),
        ("HELLO layout tp=10**5000", _hello(run_id="evil-layout2", layout="tp=" + "9" * 5000)),
        ("HELLO not an object", encode_json(Msg.HELLO, [1, 2, 3])),
        ("HELLO empty object", encode_json(Msg.HELLO, {})),
        ("HELLO 100k-deep JSON", _raw_json(Msg.HELLO, "[" * 100_000 + "]" * 100_000)),
        ("HELLO 100k-deep object", _raw_json(Msg.HELLO, '{"a":' * 100_000 + "1" + "}" * 100_000)),
        ("HELLO garbage JSON", _raw_json(Msg.HELLO, "{not json")),
        ("HELLO invalid UTF-8", _frame(int(Msg.HELLO), b"\xff\xfe{}")),
        ("HELLO JSON frame declaring 60 MiB", _frame(int(Msg.HELLO), b"{", length=60 << 20)),
        ("HELLO of 1 MiB of [] lists", _raw_json(Msg.HELLO, "[" + ",".join(["[]"] * 349_000) + "]")),
        ("HELLO twice", _hello(run_id="mixed") + _hello(run_id="mixed")),
        ("bad magic", _frame(int(Msg.HELLO), b"{}", magic=b"EVIL")),
        ("bad version", _frame(int(Msg.HELLO), b"{}", version=99)),
        ("unknown message type", _frame(999, b"")),
        ("server message type ACK", _frame(int(Msg.ACK), b"{}")),
        ("truncated header", MAGIC + b"\x02"),
        ("declared length 2**32-1", _frame(int(Msg.STEPS), b"", length=0xFFFFFFFF)),
        ("STEPS before HELLO", encode_array(Msg.STEPS, _steps(1))),
        ("FLUSH before HELLO", encode_json(Msg.FLUSH, {"seq": 1})),
        ("FLUSH seq=1e999", MIXED + _raw_json(Msg.FLUSH, '{"seq": 1e999}')),
        ("FLUSH seq=true", MIXED + _raw_json(Msg.FLUSH, '{"seq": true}')),
        ("FLUSH seq=-1", MIXED + _raw_json(Msg.FLUSH, '{"seq": -1}')),
        ("FLUSH seq missing", MIXED + _raw_json(Msg.FLUSH, '{}')),
        ("FLUSH list", MIXED + _raw_json(Msg.FLUSH, '[1]')),
        ("NAMES [[1e999,'x']]", MIXED + _raw_json(Msg.NAMES, '[[1e999,"x"]]')),
        ("NAMES [[NaN,'x']]", MIXED + _raw_json(Msg.NAMES, '[[NaN,"x"]]')),
        ("NAMES ['x']", MIXED + _raw_json(Msg.NAMES, '["x"]')),
        ("NAMES [[0, 5]]", MIXED + _raw_json(Msg.NAMES, '[[0, 5]]')),
        ("NAMES [[5,'x']] out of order", MIXED + _raw_json(Msg.NAMES, '[[5,"x"]]')),
        ("NAMES object", MIXED + _raw_json(Msg.NAMES, '{"0":"x"}')),
        ("NAMES name of 100k chars", MIXED + encode_json(Msg.NAMES, [[0, "n" * 100_000]])),
        ("STEPS payload not a multiple", MIXED + _frame(int(Msg.STEPS), b"\x00" * 25)),
        ("KERNELS name id never sent", MIXED + encode_array(Msg.KERNELS, np.ones(2, DTYPES[Msg.KERNELS]))),
        ("KERNELS name id -5", MIXED + encode_array(Msg.KERNELS, np.full(2, -5, DTYPES[Msg.KERNELS]))),
        ("DROPS huge and negative", MIXED + encode_array(Msg.DROPS, np.array(
            [(255, -(1 << 62), 1 << 62)], DTYPES[Msg.DROPS]))),
        ("BYE then garbage", MIXED + encode_json(Msg.BYE, {}) + b"garbage" * 10),
        ("STEPS step=2**63-1", MIXED + encode_array(Msg.STEPS, np.array([((1 << 63) - 1, 1, 2)], DTYPES[Msg.STEPS]))),
        ("STEPS step=-5", MIXED + encode_array(Msg.STEPS, _steps(-5))),
        ("STEPS end before start", MIXED + encode_array(Msg.STEPS, np.array([(7, 100, 50)], DTYPES[Msg.STEPS]))),
        ("STEPS over 200k distinct steps", MIXED + encode_array(Msg.STEPS, _spread(200_000))),
        ("KERNELS negative durations", MIXED + encode_json(Msg.NAMES, [[0, "k"]]) + encode_array(
            Msg.KERNELS, np.array([(1, 10, -(1 << 40), 0, 0, 0, 0)], DTYPES[Msg.KERNELS]))),
    ]
    rng = random.Random(1234)
    valid = [_hello(run_id="evil-mut"), encode_json(Msg.FLUSH, {"seq": 3}), encode_json(Msg.NAMES, [[0, "k"]])]
    for i in range(40):  # mutated valid frames: flipped bytes, cut, extended
        frame = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        if rng.random() < 0.3:
            frame = frame[:rng.randrange(1, len(frame))]
        cases.append((f"mutated frame #{i}", MIXED * (i % 2) + bytes(frame)))
    for i in range(10):  # random bytes, some behind a valid header
        blob = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
        if i % 2:
            blob = _frame(rng.choice([1, 2, 3, 4, 5, 8, 9]), blob)
        cases.append((f"random bytes #{i}", MIXED * (i % 3 == 0) + blob))
    return cases


def _ring_cases(tmp: Path) -> list[tuple[str, bytes, Callable[[], None] | None]]:
    """HELLOs naming a ring file that is not a ring, lies about its sizes, or shrinks later."""
    fifo = tmp / "fifo.ring"
    os.mkfifo(fifo)
    garbage = tmp / "garbage.ring"
    garbage.write_bytes(os.urandom(64 << 10))
    sparse = tmp / "sparse.ring"
    with open(sparse, "wb") as fh:
        fh.truncate(2 << 30)
    out: list[tuple[str, bytes, Callable[[], None] | None]] = []
    for label, path in (("missing", tmp / "nope.ring"), ("/dev/zero", Path("/dev/zero")), ("a FIFO", fifo),
                        ("a directory", tmp), ("garbage", garbage), ("2 GiB sparse", sparse)):
        out.append((f"ring: {label}", _hello(run_id="mixed", ring=str(path)), None))

    def lying(field_off: int, value: bytes, label: str) -> None:
        w = RingWriter.create(tmp, tag=label)
        w._mm[field_off:field_off + len(value)] = value
        out.append((f"ring: {label}", _hello(run_id="mixed", ring=str(w.path)), None))

    lying(56, struct.pack("<Q", 1 << 40), "names area past the file")
    lying(80 + 4, struct.pack("<I", 0xFFFFFFFF), "table capacity 2**32-1")
    w = RingWriter.create(tmp, tag="names")
    lay = w._layout
    struct.pack_into("<QQ", w._mm, lay.names_offset, lay.names_bytes, 1 << 60)  # claims 2**60 zero-length names
    out.append(("ring: 2**60 names claimed", _hello(run_id="mixed", ring=str(w.path)), None))
    w2 = RingWriter.create(tmp, tag="heads")
    for i in range(4):
        struct.pack_into("<Q", w2._mm, 4096 + 64 * i, (1 << 63) + 5)  # heads far past tails
    out.append(("ring: heads at 2**63", _hello(run_id="mixed", ring=str(w2.path)), None))
    w3 = RingWriter.create(tmp, tag="shrink")
    w3.extend(Msg.STEPS, _steps(1))
    out.append(("ring: truncated after HELLO", _hello(run_id="mixed", ring=str(w3.path)),
                lambda: os.truncate(w3.path, 4096)))
    return out


def _status(store: Path) -> dict:
    try:
        return json.loads((store / "processors" / "node-0.json").read_text())
    except (OSError, ValueError):
        return {}


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Harness:
    """One processor child; ``good(n)`` is the real client's round trip after each case."""

    def __init__(self, root: Path):
        self.root = root
        self.sock = root / "p.sock"
        self.store = root / "store"
        self.proc: subprocess.Popen | None = None
        self.step = 0
        self.log = root / "processor.log"

    def start(self) -> None:
        def limits() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))

        self.sock.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "argus", "processor", "--store", str(self.store), "--socket", str(self.sock),
             "--host", "node-0", "--window-steps", "1", "--no-fsync", "--no-evidence", "--no-stacks",
             "--hw-interval", "3600", "--max-pending-frame-mb", str(PENDING_MB), "--max-connections", "100000"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"), preexec_fn=limits)
        deadline = time.monotonic() + 60
        while not self.sock.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"processor did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def good(self) -> str | None:
        """None if a real client's window is acknowledged, else what went wrong."""
        self.step += 1
        n = self.step
        try:
            c = ProcessorClient(self.sock, {"run_id": "good", "attempt_id": "0", "rank": 0, "world_size": 1,
                                            "host": "node-0", "pid": os.getpid()}, timeout_s=10).connect(retries=20)
            try:
                c.names.id("good-kernel")
                c.send(Msg.STEPS, _steps(n))
                c.flush(n)
                c.wait_for_ack(lambda a: a.get("seq") == n, timeout_s=20)
            finally:
                c.close()
        except (OSError, TimeoutError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def hostile(self, data: bytes, after: Callable[[], None] | None = None) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(str(self.sock))
            s.sendall(data)
            if after is not None:
                time.sleep(0.3)  # the processor's loop has read the HELLO and mapped the ring
                after()
                time.sleep(0.3)
            s.shutdown(socket.SHUT_WR)
            try:
                while s.recv(65536):  # until the processor closes (dropped) or answers and we stop
                    pass
            except (TimeoutError, OSError):
                pass
        except OSError:
            pass
        finally:
            s.close()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _seed_store(store: Path) -> None:
    """Before the processor starts: a corrupt attempt.json and an attempt of another layout."""
    from argus.store import Store
    from argus.topology import RunIdentity, parse_layout

    Store.create(store).open_or_create_attempt(RunIdentity("disk-layout", "0"), parse_layout("", world_size=2),
                                               source="test")
    corrupt = store / "runs" / "corrupt" / "0"
    corrupt.mkdir(parents=True)
    (corrupt / "attempt.json").write_text('{"run_id": "corrupt", "layo')


def run_corpus(root: Path, report: Callable[[str, str], None]) -> Harness:
    """Every case; ``report(case, outcome)``; a dead processor is restarted (old trees)."""
    h = Harness(root)
    _seed_store(h.store)
    h.start()
    try:
        _run_cases(h, root, report)
    except BaseException:
        h.stop()
        raise
    return h


def _run_cases(h: Harness, root: Path, report: Callable[[str, str], None]) -> None:
    ring_tmp = root / "rings"
    ring_tmp.mkdir()

    def check(name: str) -> None:
        if not h.alive():
            report(name, f"processor died (exit {h.proc.returncode if h.proc else '?'})")
            h.start()
            return
        bad = h.good()
        report(name, "ok" if bad is None else f"real client failed: {bad}")
        if not h.alive():
            h.start()

    check("baseline")
    cases = [(n, d, None) for n, d in _cases()] + _ring_cases(ring_tmp)
    cases += [("HELLO layout differs from the attempt on disk", _hello(run_id="disk-layout", world_size=4), None),
              ("HELLO of a run whose attempt.json is corrupt", _hello(run_id="corrupt"), None),
              ("HELLO of that run again (refusal cached)", _hello(run_id="corrupt"), None)]
    for name, data, after in cases:
        h.hostile(data, after)
        check(name)
    # one valid rank of a 2-rank attempt, then a second rank reporting another layout
    first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    first.connect(str(h.sock))
    first.sendall(_hello(run_id="mixed2", rank=0, world_size=4, layout="tp=2"))
    h.hostile(_hello(run_id="mixed2", rank=1, world_size=4, layout="tp=4"))
    check("HELLO layout differs from the attempt in memory")
    first.close()
    # unfinished frames held open: 12 × 8 MiB of 64 MiB frames against a 32 MiB budget
    held = []
    for _ in range(12):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect(str(h.sock))
            s.sendall(MIXED + _frame(int(Msg.KERNELS), b"", length=64 << 20) + b"\0" * (8 << 20))
        except OSError:
            pass
        held.append(s)
    check("12 unfinished 64 MiB frames held open")
    for s in held:
        s.close()
    # the windows of the hostile batches are written before the flood takes every descriptor
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any((_status(h.store).get("open_windows") or {"?": [0]}).values()):
        time.sleep(0.2)
    # a flood past the descriptor limit (accept fails with EMFILE), held while a real client tries
    flood = []
    for _ in range(FLOOD):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(h.sock))
        except (BlockingIOError, OSError):
            pass
        flood.append(s)
    time.sleep(1.0)
    report("flood of connections (processor alive while held)", "ok" if h.alive() else "processor died")
    for s in flood:
        s.close()
    check(f"flood of {FLOOD} connections under RLIMIT_NOFILE={NOFILE}")


def test_the_processor_serves_a_real_client_after_every_hostile_one():
    root = Path(tempfile.mkdtemp(prefix="argus-fz-"))  # short: unix socket paths cap at 108 bytes
    outcomes: list[tuple[str, str]] = []
    h = run_corpus(root, lambda case, outcome: outcomes.append((case, outcome)))
    try:
        failed = [(c, o) for c, o in outcomes if o != "ok"]
        assert not failed, f"{len(failed)} of {len(outcomes)} cases failed: {failed[:10]}\n" + \
            h.log.read_text()[-3000:]
        assert h.proc is not None
        peak = _peak_rss_mb(h.proc.pid)
        assert peak < MAX_RSS_MB, f"processor peak RSS {peak:.0f} MB"
        stats = _status(h.store)
        deadline = time.monotonic() + 10
        while stats.get("accept_errors", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = _status(h.store)
        drops = stats["dropped_clients"]
        for reason in ("protocol", "bad_hello", "attempt_refused", "frame_budget"):
            assert drops.get(reason, 0) > 0, (reason, drops)
        assert stats["accept_errors"] > 0, stats
        assert stats.get("ring_errors", 0) >= 6, stats
        assert "corrupt/0" in stats["refused_attempts"] and "disk-layout/0" in stats["refused_attempts"]
        runs = sorted(p.name for p in (h.store / "runs").iterdir())
        assert runs == ["corrupt", "disk-layout", "good", "mixed", "mixed2"], runs
        assert (h.store / "runs" / "corrupt" / "0" / "attempt.json").read_text() == '{"run_id": "corrupt", "layo'
        assert "Traceback" not in h.log.read_text()
        from argus.processor.assembler import MAX_OPEN_WINDOWS, MAX_STEP
        from argus.store import Store

        mixed = Store.open(h.store).attempt("mixed")
        steps = mixed.read("steps", columns=["step", "start_ns", "end_ns"]).to_pydict()
        assert steps["step"] and 0 <= min(steps["step"]) and max(steps["step"]) <= MAX_STEP
        assert all(e >= s for s, e in zip(steps["start_ns"], steps["end_ns"]))
        spread = {x for x in steps["step"] if x >= 10_000_000}  # the 200k-step batch: its first windows only
        assert 0 < len(spread) <= MAX_OPEN_WINDOWS, len(spread)
        drops = mixed.read("drops").to_pydict()
        reasons = set(drops["reason"])
        assert {"invalid_values", "too_many_windows"} <= reasons, reasons
        assert min(mixed.read("kernels", columns=["dur_ns"]).to_pydict()["dur_ns"] or [0]) >= 0
    finally:
        code = h.stop()
    assert code == 0, h.log.read_text()[-3000:]
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # the corpus against whatever tree is on sys.path: one line per case
    tmp = Path(tempfile.mkdtemp(prefix="argus-fz-"))
    t0 = time.monotonic()
    last = [time.monotonic()]

    def show(case: str, outcome: str) -> None:
        now = time.monotonic()
        print(f"{now - last[0]:5.2f}s {outcome[:80]:<82}| {case}", flush=True)
        last[0] = now

    harness = run_corpus(tmp, show)
    print(f"peak RSS {_peak_rss_mb(harness.proc.pid) if harness.alive() else float('nan'):.0f} MB, "
          f"{time.monotonic() - t0:.1f} s, status drops {_status(harness.store).get('dropped_clients')}")
    harness.stop()
