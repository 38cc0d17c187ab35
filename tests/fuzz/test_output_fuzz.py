"""Hostile names through every output: the safe-text helpers (Hypothesis), then one real
store of generated hostile names through ``argus info``/``diagnose``/``report`` and the web UI.

Each part runs in a child under a memory limit (``run_bounded``) and prints a JSON summary;
the assertions are: no traceback, bounded memory, no raw control/bidi character in terminal
output or a page, markup shown as text, no unescaped HTML/JS payload.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.fuzz.bounded import run_bounded

REPO = Path(__file__).resolve().parents[2]

# Child 1: properties of visible / term / esc over Hypothesis-generated text, and megabyte names.
_HELPERS = r'''
import html, io, json, re, time, unicodedata
from hypothesis import HealthCheck, given, settings, strategies as st
from rich.console import Console
from rich.table import Table
from rich.text import Text
from argus.report.svg import esc
from argus.text import MAX_TERMINAL_CHARS, term, visible
from tests.cli.test_safe_output import PAYLOADS

INVISIBLE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours on a terminal: the only escapes allowed
FRAGMENTS = list(PAYLOADS) + ["[/", "[", "]", "\\", "\x1b", "\x07", "\x00", "\u202e", "\u2066", "\ud800",
                              "\udfff", "\x85", "\u2029", "\ufeff", ":fire:", "<script>", "&amp;", "'", '"', "\r\n"]
names = st.one_of(st.text(st.characters(exclude_categories=()), max_size=80),
                  st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=5)), max_size=8).map("".join))
count = 0

def no_invisible(text, allow=""):
    bad = [c for c in text if c not in allow and unicodedata.category(c) in INVISIBLE]
    assert not bad, (text[:200], bad[:5])

@settings(max_examples=400, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(names)
def check(s):
    global count
    count += 1
    v = visible(s)
    no_invisible(v)
    v.encode("utf-8")  # lone surrogates are escaped: the text can always be written
    assert Text.from_markup(f"[bold]{term(s, limit=10**9)}[/bold]", emoji=False).plain == v
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True, color_system="truecolor", emoji=False, highlight=False, width=100)
    table = Table("name", "n")
    table.add_row(term(s), "1")
    con.print(table)
    con.print(f"[cyan]{term(s)}[/cyan] in [bold]phase[/bold]")
    no_invisible(SGR.sub("", buf.getvalue()), allow="\n")
    h = esc(s)
    assert not set(h) & set("<>\"'") and html.unescape(h) == v
    no_invisible(h)

check()
huge = {}
for label, s in (("5M plain", "k" * 5_000_000), ("2M hostile", "\x1b]0;x\x07[/]\u202e<b>" * 200_000),
                 ("1M astral format", "\U000e0041" * 1_000_000)):
    t0 = time.perf_counter()
    shown = term(s)
    assert len(shown) < 2 * MAX_TERMINAL_CHARS * 10 and "\x1b" not in shown
    h = esc(s)
    assert "\x1b" not in h and "<b>" not in h
    huge[label] = round(time.perf_counter() - t0, 3)
print(json.dumps({"examples": count, "huge_s": huge}))
'''

# Child 2: one store with generated hostile names through the CLI and the web UI.
_STORE = r'''
import io, json, random, sys, tempfile, unicodedata, http.client
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from urllib.parse import quote
import pyarrow as pa, pyarrow.parquet as pq
from argus.cli.main import main
from argus.serve import ArgusServer, ServeConfig
from argus.store import Store
from tests.cli.test_safe_output import RAW, make_hostile_store

rng = random.Random(1)
FRAGMENTS = ["\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m", "[/]", "[red]", "[/red", "\\[", "\x00", "\x7f", "\u202e",
             "\u2066", "\u2028", "</script><img src=x onerror=alert(1)>", "<svg onload=alert(2)>", "'\"", "&lt;",
             ":fire:", "ünï", "\ufeff", "\u200b", "%s%n", "{0}", "\r"]
payloads = tuple("".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 5))) for _ in range(12))
tmp = Path(tempfile.mkdtemp())
# the run id is a directory name: anything but "/" and NUL
store = make_hostile_store(tmp / "S", payloads=payloads, run_id="run-\x1b]2;t\x07[red\u202e<i>")
attempt = Store.open(store).attempt()
for f in (attempt.path / "topology").rglob("*.parquet"):  # host names of 5,000 characters
    t = pq.read_table(f)
    hosts = [("\x1b[31m[/]" * 500) + "x" * 4000 + str(h)[-12:] for h in t.column("host").to_pylist()]
    pq.write_table(t.set_column(t.schema.get_field_index("host"), "host", pa.array(hosts)), f)

def invisible(text, allow="\n"):
    return sorted({repr(c) for c in text if c not in allow and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})

summary = {"payloads": len(payloads), "cli": {}, "ui": {}}
for argv in (["info", str(store)], ["diagnose", str(store), "--no-store", "--evidence"],
             ["diagnose", str(store), "--json", "--no-store"], ["report", str(store), "--out", str(tmp / "r.html")]):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    text = out.getvalue() + err.getvalue()
    summary["cli"][" ".join(argv[:1] + argv[2:3])] = {"rc": rc, "chars": len(text), "invisible": invisible(text)}
    if "--json" in argv:
        json.loads(out.getvalue())
page = (tmp / "r.html").read_text(encoding="utf-8")
pages = {"report": page}
with ArgusServer(ServeConfig(store=store, port=0)) as server:
    server.start()
    def get(path):
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8")
    code, runs = get("/api/runs")
    run = json.loads(runs)["runs"][0]
    pages["runs"] = get("/")[1]
    code, pages["run"] = get(run["url"] + "?wait=120")
    incidents = json.loads(get(run["api"] + "/incidents")[1])["incidents"]
    summary["ui"]["incidents"] = len(incidents)
    for inc in incidents[:2]:
        code, pages["incident " + inc["id"]] = get(inc["url"])
        summary["ui"][inc["id"]] = code
summary["pages"] = {name: {"chars": len(p), "raw": [c for c in RAW if c in p], "invisible": invisible(p),
                           "payload": [x for x in ("<img src=x", "<svg onload", "</script><img") if x in p],
                           "escaped": "onerror=alert(1)&gt;" in p}
                    for name, p in pages.items()}
print(json.dumps(summary))
'''


def _summary(code: str, mem_mb: int, timeout_s: float) -> dict:
    r = run_bounded(code, mem_mb=mem_mb, timeout_s=timeout_s, cwd=REPO)
    assert r.returncode == 0 and not r.traceback, (r.returncode, r.stderr[-3000:])
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    summary["peak_mb"] = r.peak_mb
    return summary


def test_safe_text_helpers_hold_for_generated_hostile_names():
    s = _summary(_HELPERS, mem_mb=3072, timeout_s=120)
    assert s["examples"] == 400
    assert all(t < 10 for t in s["huge_s"].values()), s["huge_s"]  # linear: a megabyte name is not a hang
    assert s["peak_mb"] < 1500, s


def test_a_store_of_hostile_names_through_the_cli_report_and_ui():
    s = _summary(_STORE, mem_mb=4096, timeout_s=150)
    for command, c in s["cli"].items():
        assert c["rc"] == 0 and c["invisible"] == [], (command, c)
    assert s["ui"]["incidents"] >= 1 and all(v == 200 for k, v in s["ui"].items() if k != "incidents"), s["ui"]
    for name, p in s["pages"].items():
        assert p["raw"] == [] and p["invisible"] == [] and p["payload"] == [], (name, p)
    assert s["pages"]["report"]["escaped"] or s["pages"]["run"]["escaped"], s["pages"]
    assert s["peak_mb"] < 3000, s
