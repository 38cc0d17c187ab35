"""In-process stack sampling: folded stacks of the training thread, Argus's own frames cut."""

from __future__ import annotations

import sys
import time

from argus.producer.recorder import Recorder
from argus.wire import Msg, RingReader, RingWriter
from argus.producer.stacks import StackSampler, fold


def _frame_via(filename: str):
    """A frame whose innermost function lives in ``filename`` (as if defined there)."""
    code = compile("def inner():\n    return sys._getframe()\n", filename, "exec")
    ns = {"sys": sys}
    exec(code, ns)
    return ns["inner"]()


def test_fold_is_root_first():
    folded = fold(sys._getframe())
    assert folded.split(";")[-1].startswith("test_fold_is_root_first (")


def test_fold_cuts_argus_hook_frames_and_their_trampolines():
    own = _frame_via("/site-packages/argus/producer/kernels.py")
    folded = fold(own)
    assert "argus/producer" not in folded
    assert folded.split(";")[-1].startswith("_frame_via (")


class _Rt:
    step = 7


def test_sampler_aggregates_counts_per_step(tmp_path):
    ring = RingWriter.create(tmp_path)
    reader = RingReader(ring.path)
    rec = Recorder(ring)
    sampler = StackSampler(rec, _Rt(), hz=200.0)
    sampler.start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        sum(i * i for i in range(1000))  # busy on the main thread
    sampler.stop()
    sampler._thread.join(2)
    names = reader.new_names()
    rows = reader.drain(settled=False)[Msg.STACKS]
    assert len(rows), "no stack samples"
    assert (rows["step"] == 7).all()
    total = int(rows["count"].sum())
    assert 10 <= total <= 80  # ~60 at 200 Hz over 0.3 s, allowing for a loaded machine
    assert any("test_sampler_aggregates_counts_per_step" in names[i] for i in rows["frames"])


def test_fold_keeps_user_code_called_from_an_argus_hook():
    code = compile("def hook():\n    return user()\n", "/site-packages/argus/producer/torch_hooks.py", "exec")
    user = compile("def user():\n    return sys._getframe()\n", "/work/train.py", "exec")
    ns = {"sys": sys}
    exec(user, ns)
    exec(code, ns)
    folded = fold(ns["hook"]())
    assert "argus/producer" not in folded
    assert folded.split(";")[-1].startswith("user (/work/train.py")
