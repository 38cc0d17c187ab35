"""``argus verify STORE INCIDENT [--health FILE]``: settle an incident's hardware claim by measuring."""

from __future__ import annotations

import argparse
import json
import sys

from argus.cli.progress import stderr_console, stdout_console
from argus.errors import ArgusError
from argus.text import term

__all__ = ["register", "EXIT_CONFIRMED", "EXIT_REFUTED", "EXIT_INCONCLUSIVE"]

#: Exit codes: what a prolog or a cordon script acts on.
EXIT_REFUTED, EXIT_INCONCLUSIVE, EXIT_ERROR, EXIT_CONFIRMED = 0, 1, 2, 3


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify", help="check an incident's hardware suspect against a healthy peer (argus healthcheck)",
        description="With --health (the JSON of `argus healthcheck --json` run on the suspect and a peer), or a "
                    "health report kept in the store (`argus healthcheck --store`): judge the incident confirmed, "
                    "refuted or inconclusive, and record it in the store, where `argus diagnose` shows it; with neither, say "
                    "which healthcheck to run where. "
                    "Exit code: 3 confirmed, 0 refuted (the hardware is healthy), 1 inconclusive, 2 error.")
    p.add_argument("store", help="store directory or s3://bucket/prefix (a prom:// source is read-only: use --no-store)")
    p.add_argument("incident", help="incident id (inc-…, from `argus diagnose`)")
    p.add_argument("--health", metavar="FILE", help="`argus healthcheck --json` output ('-': stdin); default: the "
                                                    "newest one kept in the store (healthcheck --store) that measured "
                                                    "a suspect")
    p.add_argument("--run", help="run id (default: latest)")
    p.add_argument("--attempt", help="attempt id (default: latest)")
    p.add_argument("--json", action="store_true", help="print the verification (JSON)")
    p.add_argument("--no-store", action="store_true", help="do not record the outcome in the store")
    p.set_defaults(func=run)


def _incident(attempt, incident_id: str) -> dict:
    """The incident's JSON: from the stored incidents, else from a fresh diagnosis."""
    from argus.analysis import DiagnoseConfig, diagnose

    if attempt.files("incidents"):
        for row in attempt.read("incidents").to_pylist():
            if row.get("id") == incident_id:
                return {"id": row["id"], "class": row["class"], "culprit_ranks": list(row["culprit_ranks"] or []),
                        "hosts": list(row["hosts"] or []), "gpus": list(row["gpus"] or [])}
    found = diagnose(attempt, DiagnoseConfig(store_incidents=False)).incidents
    for inc in found:
        if inc.id == incident_id:
            return inc.to_json()
    ids = ", ".join(f"{i.id} ({i.klass})" for i in found[:8]) or "none"
    raise ArgusError(f"no incident {incident_id} in {attempt.identity.run_id}/{attempt.identity.attempt_id} "
                     f"(its incidents: {ids})")


def _rank_gpus(attempt, ranks: list[int]) -> dict[int, str]:
    """Each of ``ranks``' GPU UUID: the store's topology (from the rank's HELLO), else the GPU its
    ``hw`` samples name; an unreadable table costs only its answer."""
    out: dict[int, str] = {}
    try:
        uuids = attempt.topology().gpu_uuids
        out = {r: str(uuids[r]) for r in ranks if 0 <= r < len(uuids) and uuids[r]}
    except Exception:  # noqa: BLE001 - no topology rows: the hw samples may still say
        pass
    missing = [r for r in ranks if r not in out]
    if missing and attempt.files("hw"):
        import pyarrow.dataset as ds

        try:
            rows = attempt.read("hw", columns=["rank", "gpu_uuid"], filter=ds.field("rank").isin(missing))
        except Exception:  # noqa: BLE001
            return out
        for r, g in zip(rows.column("rank").to_pylist(), rows.column("gpu_uuid").to_pylist()):
            if g:
                out.setdefault(int(r), str(g))
    return out


def _health(path: str) -> dict:
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as exc:
        raise ArgusError(f"--health {path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArgusError(f"--health {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("verdicts"), list):
        raise ArgusError(f"--health {path}: not the output of `argus healthcheck --json` (no verdicts)")
    return doc


def run(args: argparse.Namespace) -> int:
    from argus.analysis.verification import Outcome, save
    from argus.cli.sources import open_source_attempt, store_root
    from argus.healthcheck.records import covering
    from argus.healthcheck.verify import NotVerifiable, judge, measures, plan, with_gpus

    attempt = open_source_attempt(args.store, args.run, args.attempt)
    incident = _incident(attempt, args.incident)
    incident = with_gpus(incident, _rank_gpus(attempt, [int(r) for r in incident.get("culprit_ranks", [])]))
    out = stdout_console()
    try:
        if args.health:
            health = _health(args.health)
        else:  # the newest health report kept in the store that measured a suspect
            found = covering(store_root(attempt), lambda doc: measures(incident, doc))
            if found is None:
                hosts = sorted(set(attempt.topology().hosts.tolist()))
                print(plan(incident, hosts))
                return 0
            path, health = found
            stderr_console().print(f"[dim]using the health report {term(path)}[/dim]")
        v = judge(incident, health)
    except NotVerifiable as exc:
        raise ArgusError(str(exc)) from None
    where = None
    if not args.no_store:
        try:
            where = save(attempt.path, v)
        except OSError as exc:
            stderr_console().print(f"[yellow]not recorded in the store ({term(str(exc))})[/yellow]")
    if args.json:
        print(json.dumps(v.to_json(), indent=1))
    else:
        colour = {"confirmed": "bold red", "refuted": "green", "inconclusive": "yellow"}[str(v.outcome)]
        out.print(f"[bold]{term(v.incident)}[/bold] ({term(v.klass)}): [{colour}]{v.outcome}[/{colour}] — "
                  f"{term(v.reason)}", highlight=False)
        if where is not None:
            stderr_console().print(f"[dim]recorded in {term(where)}; `argus diagnose` shows it[/dim]")
    return {Outcome.CONFIRMED: EXIT_CONFIRMED, Outcome.REFUTED: EXIT_REFUTED}.get(v.outcome, EXIT_INCONCLUSIVE)
