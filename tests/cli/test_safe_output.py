"""Names from traces reach the terminal and the report as text: rich markup shown, not
parsed; control, bidi and separator characters shown as escapes, never emitted raw."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from argus.report.svg import esc
from argus.text import MAX_TERMINAL_CHARS, term, visible

pytestmark = pytest.mark.parallel_ok  # hostile names through the CLI: nothing is timed

REPO = Path(__file__).resolve().parents[2]
OSC = "\x1b]0;pwned\x07"
#: One of each kind of trouble: an OSC title change with BEL, a CSI colour, the 8-bit CSI, NUL,
#: DEL, rich markup (an unmatched closing tag raises in rich), an emoji code, a bidi override,
#: a line separator and an HTML/JS payload.
PAYLOADS = (f"{OSC}[red]x[/]", "\x1b[31m[/]", "\x9b2J\x00\x7f", "[bold]:fire:[/bold][/]", "\u202eevil\u2028",
            "</script><img src=x onerror=alert(1)>", "\\[/]\\")
RUN_ID = "run-\x1b[2J[red]\u202e<b>"  # a directory name: no "/"
#: What must never be in a terminal's output or a page: the raw characters the payloads carry.
RAW = ("\x1b", "\x07", "\x00", "\x7f", "\x9b", "\u202e", "\u2028")
# name columns that diagnosis and the report show
NAME_COLUMNS = {"phases": ["name"], "topology": ["host"], "stacks": ["frames", "thread"],
                "kernel_summaries": ["kernel"]}


def make_hostile_store(dst: Path, payloads: tuple[str, ...] = PAYLOADS, run_id: str = RUN_ID) -> Path:
    """A simulated compute straggler (16 ranks, 20 steps) whose run id and every phase, host,
    frame, thread and kernel name start with a hostile payload (distinct names stay distinct)."""
    from argus.sim import SimConfig, simulate_to_store
    from argus.store import Store

    simulate_to_store(SimConfig(ranks=16, steps=20, kernels=False, run_id="plain"), "compute_straggler", dst)
    attempt = Store.open(dst).attempt()
    for table, cols in NAME_COLUMNS.items():
        for f in sorted((attempt.path / table).rglob("*.parquet")):
            t = pq.read_table(f)
            for c in cols:
                values = t.column(c).to_pylist()
                names = {v: f"{payloads[i % len(payloads)]}{v}" for i, v in enumerate(sorted(set(values)))}
                t = t.set_column(t.schema.get_field_index(c), c, pa.array([names[v] for v in values]))
            pq.write_table(t, f)
    meta_path = attempt.path / "attempt.json"
    meta = json.loads(meta_path.read_text())
    meta["run_id"], meta["scenario"] = run_id, payloads[0]
    meta_path.write_text(json.dumps(meta))
    (dst / "truth.json").unlink()  # the simulator's truth names the plain run
    attempt.path.parent.rename(dst / "runs" / run_id)
    return dst


def raw_in(text: str) -> list[str]:
    return [repr(c) for c in RAW if c in text]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "S"
    return make_hostile_store(out)


def _argus(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "argus", *args], capture_output=True, cwd=cwd or REPO,
                          timeout=300)


def test_every_invisible_code_point_is_made_visible_and_nothing_else():
    """The regex's ranges against the five-line loop over all of Unicode."""
    invisible = {"Cc", "Cf", "Cs", "Zl", "Zp"}
    for cp in range(0x110000):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        shown = visible(ch)
        if cat in invisible:
            assert shown != ch and shown.startswith("\\") and shown.isascii(), hex(cp)
        elif cat != "Cn":  # unassigned in this Python's Unicode: may become format characters later
            assert shown == ch, hex(cp)


def test_visible_writes_python_escapes():
    assert visible(f"{OSC}a\u202eb\U000e0041\ud800") == "\\x1b]0;pwned\\x07a\\u202eb\\U000e0041\\ud800"
    assert visible("aten::mm [tp] ✓ ünïcode") == "aten::mm [tp] ✓ ünïcode"
    assert visible(7) == "7"


def test_term_is_text_under_rich_markup():
    from rich.text import Text

    for s in (*PAYLOADS, RUN_ID, "\\", "a\\", "[", "[/", "[link=file:///etc/passwd]x[/link]"):
        # as the CLI uses it: inside markup of its own (our consoles have emoji off)
        assert Text.from_markup(f"[bold]{term(s)}[/bold] and", emoji=False).plain == visible(s) + " and", s
    long = "k" * (MAX_TERMINAL_CHARS + 10)
    assert Text.from_markup(term(long), emoji=False).plain == "k" * MAX_TERMINAL_CHARS + "…(+10 chars)"


def test_html_escaping_shows_the_escapes_too():
    assert esc("</script><img src=x onerror=alert(1)>") == "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
    assert esc(f'{OSC}"\u202e') == "\\x1b]0;pwned\\x07&quot;\\u202e"


@pytest.mark.parametrize("command", [["info"], ["diagnose", "--no-store", "--evidence"]])
def test_the_cli_prints_hostile_names_as_text(hostile, command):
    r = _argus(command[0], str(hostile), *command[1:])
    out, err = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    assert r.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert not raw_in(out) and not raw_in(err)
    assert "run-\\x1b[2J[red]\\u202e<b>" in out  # the run id, as written
    if command[0] == "info":
        assert "\\x1b]0;pwned\\x07[red]x[/]" in out and ":fire:" in out and "\\x9b2J\\x00\\x7f" in out
    else:
        assert "compute_straggler" in out and "\\x1b]0;pwned\\x07[red]x[/]" in out  # a culprit's host or phase


def test_diagnose_stores_and_prints_incidents_of_a_hostile_store(hostile, tmp_path):
    import shutil

    store = tmp_path / "S"
    shutil.copytree(hostile, store)
    r = _argus("diagnose", str(store))
    err = r.stderr.decode("utf-8")
    assert r.returncode == 0 and "Traceback" not in err, err[-2000:]
    assert not raw_in(r.stdout.decode("utf-8")) and not raw_in(err)
    assert "incidents in" in err  # stored first, then printed: the print no longer fails after the write


def test_the_report_escapes_hostile_names(hostile, tmp_path):
    out = tmp_path / "r.html"
    r = _argus("report", str(hostile), "--out", str(out))
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-2000:]
    assert not raw_in(r.stderr.decode("utf-8"))
    page = out.read_text(encoding="utf-8")
    assert not raw_in(page)
    assert "<img src=x" not in page and "</script><img" not in page
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert "run-\\x1b[2J[red]\\u202e&lt;b&gt;" in page
