"""``argus bench gpu-overhead``: tracing cost on one CUDA GPU, and CUPTI capture checked.

A GPT-2-small-class model (12 layers, d = 768, 12 heads, vocab 50,257, sequence 1,024; the
blocks of ``argus.workloads.train_transformer``) trains in bf16 autocast with AdamW. Each
mode runs in its own process (a fresh CUDA context; CUPTI allows one activity subscriber on
drivers before r610):

* ``none`` — untraced;
* ``argus`` — ``argus.init()`` against a real processor: phases timed with CUDA events
  resolved off the training thread, CUPTI kernels, stacks, NVML;
* ``profiler`` — ``torch.profiler`` (CPU + CUDA activities) kept on for the whole run.

Each step ends with ``torch.cuda.synchronize()`` in every mode (the same for all; Argus
itself never synchronises). Reported: mean step time and its ratio to ``none``, peak host
RSS and peak GPU memory. The CUPTI check runs the same seeded steps twice in two processes —
once captured by Argus's CUPTI source, once by ``torch.profiler`` — and compares kernels per
step, kernel names (normalised) and total kernel time.

Needs a CUDA GPU; without one it says so and exits with 2. Never run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

__all__ = ["main"]

SEQ, VOCAB, D, LAYERS, HEADS = 1024, 50257, 768, 12, 12


def _model_and_opt(torch):
    from argus.workloads.train_transformer import Stage

    torch.manual_seed(0)
    model = Stage(VOCAB, D, HEADS, LAYERS, first=True, last=True).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def _step(torch, model, opt, batch: int, step: int) -> None:
    import torch.nn.functional as F

    g = torch.Generator(device="cuda").manual_seed(step)
    x = torch.randint(0, VOCAB, (batch, SEQ), device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).view(-1, VOCAB).float(), x.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def _worker(mode: str, steps: int, batch: int, out: Path, sock: str | None) -> None:
    import torch

    if mode == "argus":
        import argus

        assert argus.init(socket_path=sock, run_id="gpu-bench", kernels="cupti"), "argus.init failed"
    model, opt = _model_and_opt(torch)
    prof = None
    if mode == "profiler":
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    times = []
    for s in range(steps):
        t0 = time.perf_counter()
        _step(torch, model, opt, batch, s)
        times.append(time.perf_counter() - t0)
    doc = {"mode": mode, "step_s": times, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20}
    if prof is not None:
        prof.__exit__(None, None, None)
    if mode == "argus":
        import argus

        argus.shutdown()
    out.write_text(json.dumps(doc))
    os._exit(0)


def _capture(source: str, first: int, count: int, batch: int, out: Path) -> None:
    """Kernels of steps ``first .. first+count-1``, captured by Argus's CUPTI source or by
    torch.profiler: [(normalised name, duration ns)] per step."""
    import torch

    from argus.compress.names import normalize_kernel_name as normalize

    model, opt = _model_and_opt(torch)
    for s in range(first):
        _step(torch, model, opt, batch, s)
    per_step: list[list] = []
    if source == "argus":
        import tempfile

        from argus.producer.cupti import CuptiSource
        from argus.producer.recorder import Recorder
        from argus.wire import Msg, RingReader, RingWriter

        ring = RingWriter.create(tempfile.mkdtemp(prefix="argus-gpu-"), {Msg.KERNELS: 1 << 20})
        reader = RingReader(ring.path)
        cupti = CuptiSource(Recorder(ring))
        cupti.start()
        names: list[str] = []
        for s in range(first, first + count):
            _step(torch, model, opt, batch, s)
            cupti.flush()
            time.sleep(0.05)  # completed buffers arrive on CUPTI's thread
            ring.settle()
            names += reader.new_names()
            drained = reader.drain(settled=False).get(Msg.KERNELS)
            rows = drained[drained["kind"] == 0] if drained is not None else []
            per_step.append([(normalize(names[int(r["name"])]), int(r["dur_ns"])) for r in rows])
        cupti.stop()
    else:
        for s in range(first, first + count):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                _step(torch, model, opt, batch, s)
            per_step.append([(normalize(e.name), int(e.time_range.elapsed_us() * 1000)) for e in prof.events()
                             if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy")
                             and not e.name.startswith("Memset")])
    out.write_text(json.dumps(per_step))
    os._exit(0)


def _spawn(args: list[str], timeout: float = 900) -> None:
    done = subprocess.run([sys.executable, "-m", "argus.bench.gpu_overhead", *args], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"worker {args[:2]} failed ({done.returncode}): {done.stderr[-2000:]}")


def run(steps: int, batch: int, repeats: int) -> list[dict]:
    import numpy as np

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="argus-gpu-") as tmp:
        tmp_p = Path(tmp)
        sock = str(tmp_p / "p.sock")
        proc = subprocess.Popen([sys.executable, "-m", "argus", "processor", "--store", str(tmp_p / "store"),
                                 "--socket", sock], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            results: dict[str, list[dict]] = {m: [] for m in ("none", "argus", "profiler")}
            for r in range(repeats):
                for mode in results:
                    out = tmp_p / f"{mode}-{r}.json"
                    _spawn(["--worker", mode, "--steps", str(steps), "--batch", str(batch), "--out", str(out),
                            "--socket", sock])
                    results[mode].append(json.loads(out.read_text()))
        finally:
            proc.terminate()
            proc.wait(60)
        skip = max(steps // 10, 1)
        base = float(np.mean([t for d in results["none"] for t in d["step_s"][skip:]]))
        for mode, docs in results.items():
            mean = float(np.mean([t for d in docs for t in d["step_s"][skip:]]))
            rows.append({"bench": "gpu-overhead", "mode": mode, "model": "gpt2-small-class bf16", "batch": batch,
                         "seq": SEQ, "steps": steps, "repeats": repeats, "step_ms": round(mean * 1e3, 3),
                         "ratio": round(mean / base, 4), "overhead_pct": round(100 * (mean / base - 1), 2),
                         "peak_rss_mb": round(max(d["peak_rss_mb"] for d in docs), 1),
                         "peak_gpu_mb": round(max(d["peak_gpu_mb"] for d in docs), 1)})
        caught = {}
        for source in ("argus", "profiler"):
            out = tmp_p / f"capture-{source}.json"
            _spawn(["--capture", source, "--first", "5", "--count", "3", "--batch", str(batch), "--out", str(out)])
            caught[source] = json.loads(out.read_text())
    a = [Counter(n for n, _ in s) for s in caught["argus"]]
    p = [Counter(n for n, _ in s) for s in caught["profiler"]]
    common = [sum((x & y).values()) for x, y in zip(a, p)]
    rows.append({"bench": "gpu-overhead", "mode": "cupti-check",
                 "kernels_per_step_argus": [sum(c.values()) for c in a],
                 "kernels_per_step_profiler": [sum(c.values()) for c in p],
                 "matched_share": [round(m / max(sum(y.values()), 1), 4) for m, y in zip(common, p)],
                 "kernel_time_ratio": [round(sum(d for _, d in x) / max(sum(d for _, d in y), 1), 4)
                                       for x, y in zip(caught["argus"], caught["profiler"])],
                 "only_in_profiler": sorted((sum(p, Counter()) - sum(a, Counter())).keys())[:10],
                 "only_in_argus": sorted((sum(a, Counter()) - sum(p, Counter())).keys())[:10]})
    return rows


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options, for ``argus bench gpu-overhead`` and for this module's own worker processes."""
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker", choices=["none", "argus", "profiler"], help=argparse.SUPPRESS)
    ap.add_argument("--capture", choices=["argus", "profiler"], help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    return run_args(ap.parse_args(argv))


def run_args(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        print("argus bench gpu-overhead: needs PyTorch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("argus bench gpu-overhead: no CUDA device here; run it on a machine with an NVIDIA GPU",
              file=sys.stderr)
        return 2
    if args.worker:
        _worker(args.worker, args.steps, args.batch, Path(args.out), args.socket)
    if args.capture:
        _capture(args.capture, args.first, args.count, args.batch, Path(args.out))
    for row in run(args.steps, args.batch, args.repeats):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
