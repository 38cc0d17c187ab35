"""The tee passes every byte through as the job wrote it, and a broken output never blocks the job."""

from __future__ import annotations

import os
import random

from argus.joblog import LogScanner, Tee


def _pump(data: bytes, out_w: int | None) -> tuple[Tee, bytes]:
    r, w = os.pipe()
    out_r, out_w_ = os.pipe() if out_w is None else (None, out_w)
    tee = Tee("stdout", r, out_w_, LogScanner()).start()
    got = bytearray()
    view = memoryview(data)
    while view:
        n = os.write(w, view[:4096])
        view = view[n:]
        if out_r is not None:
            while True:  # drain what arrived so neither pipe fills
                import select

                if not select.select([out_r], [], [], 0.01)[0]:
                    break
                got += os.read(out_r, 1 << 16)
    os.close(w)
    assert tee.join(10)
    if out_r is not None:
        os.close(out_w_)
        while chunk := os.read(out_r, 1 << 16):
            got += chunk
        os.close(out_r)
    return tee, bytes(got)


def test_every_byte_arrives_unchanged():
    rng = random.Random(3)
    data = bytes(rng.randrange(256) for _ in range(300_000)) + b"\r\nNCCL WARN x\n" + "é\u2028\n".encode() + b"tail"
    tee, got = _pump(data, None)
    assert got == data and tee.bytes == len(data)
    events, _ = tee.scanner.take()
    assert any(e.kind == "nccl_warn" for e in events)


def test_a_closed_output_still_drains_the_job():
    r, w = os.pipe()
    os.close(r)  # argus run's own stdout is gone
    tee, _ = _pump(b"line\n" * 50_000, w)  # 250 kB: more than a pipe holds
    assert tee.out_broken and tee.bytes == 250_000
