"""The web UI's HTTP server: stdlib ``ThreadingHTTPServer``, read-only over one store.

Security model (see ``docs/report.md``):

* binds 127.0.0.1 unless told otherwise; another address needs a token or ``--insecure``;
* with a token, every request must carry it — ``Authorization: Bearer T``, or a session
  cookie obtained by opening any page once with ``?token=T`` (the server then redirects to
  the same URL without it, so the token leaves the address bar and history);
* without a token (loopback only) the ``Host`` header must name a loopback host, so a web
  page elsewhere cannot reach the UI through DNS rebinding;
* evidence downloads name an attempt by identity (looked up, never joined as a path) and a
  file whose resolved path must lie inside that attempt's ``evidence`` directory, with no
  symbolic link on the way; everything else is a 404;
* pages carry a Content-Security-Policy that lets only the page's own nonce-tagged script
  run and connect only to this server; user strings are escaped on the server;
* a connection that has not yet sent an authorised request is *pending*: at most
  ``max_pending`` of them, each given ``pending_deadline_s`` in all to send one (idle and
  slowloris connections are cut), and ``max_connections`` in all (see ``ServeConfig``); over a
  cap a new connection gets an immediate 503 and is closed, while authorised ones keep
  working; every read and write has a ``socket_timeout_s`` timeout;
* only attempts and files reached from the store's root without a symbolic link, and
  resolving inside it, are listed or served.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import json
import math
import os
import re
import secrets
import socket
import stat
import sys
import threading
import time
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from argus.errors import ConfigError
from argus.report.sources import EVIDENCE_DIR
from argus.serve import pages
from argus.serve.config import ServeConfig, is_loopback
from argus.serve.state import Snapshot, StoreState, reached_without_links
from argus.text import visible

__all__ = ["ArgusServer", "make_server", "serve", "COOKIE"]

COOKIE = "argus_session"
MAX_WAIT_S = 30.0
# A path segment names a run or attempt (looked up by identity, never joined as a path), so it
# may hold any character a run id can, control characters included; never a separator or NUL.
_SEGMENT_OK = re.compile(r"^[^/\\\x00]+$")
# An evidence host directory, which does become part of a path and a header: printable only.
_HOST_OK = re.compile(r"^[^/\\\x00-\x1f\x7f]+$")
_HEADER_UNSAFE = re.compile(r"[^0-9A-Za-z._-]")
_EVIDENCE_FILE = re.compile(r"^[0-9A-Za-z_-]+\.pftrace$")
_JSON_CSP = "default-src 'none'; frame-ancestors 'none'"

_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 23\r\n"
         b"Retry-After: 5\r\nConnection: close\r\n\r\ntoo many connections\r\n\r\n")


class _NotFound(Exception):
    pass


def _clean(obj: Any) -> Any:
    """JSON-safe: NaN and ±inf become null (browsers reject them in JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _clean(obj.item())
    return obj


class ArgusServer(ThreadingHTTPServer):
    """Serves one store; ``close()`` is idempotent and backs a context manager."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # listen backlog: a burst of connections is queued and answered (503 over the cap)

    def __init__(self, config: ServeConfig):
        self.config = config
        self.state = StoreState(config.store)
        self.session = (hmac.new(config.token.encode(), b"argus-serve-session", hashlib.sha256).hexdigest()
                        if config.token else None)
        self.address_family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        self._closed = False
        self._serving = False
        self._conn_lock = threading.Lock()
        self._conns: dict[socket.socket, float | None] = {}  # connection → pending deadline; None once authorised
        self.refused = 0  # connections turned away at a cap
        self.cut = 0  # pending connections cut at their deadline
        try:
            super().__init__((config.host.strip("[]"), config.port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}; "
                              "choose another --port (0: any free one)") from None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed (a client gone mid-answer, a cut connection) is logged in one
        line: socketserver's default prints a traceback on stderr, into whatever runs us."""
        exc = sys.exc_info()[1]
        logging.getLogger("argus.serve").info("request from %s failed: %s: %s", client_address,
                                               type(exc).__name__ if exc else "?", exc)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host.strip('[]')}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    # -- connection accounting -------------------------------------------------------------
    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Admit a connection as pending, or answer 503 at once and close it."""
        with self._conn_lock:
            pending = sum(1 for d in self._conns.values() if d is not None)
            if len(self._conns) < self.config.max_connections and pending < self.config.max_pending:
                self._conns[request] = time.monotonic() + self.config.pending_deadline_s
                return True
            self.refused += 1
        try:
            request.setblocking(False)  # never wait on a client we are refusing
            request.send(_BUSY)
        except OSError:
            pass
        return False

    def authorised(self, request: Any) -> None:
        """The connection sent an authorised request: no longer pending."""
        with self._conn_lock:
            if request in self._conns:
                self._conns[request] = None

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        """Between accepts (at least every poll interval): cut pending connections past their
        deadline; the handler's blocked read then returns and its thread ends."""
        now = time.monotonic()
        with self._conn_lock:
            late = [c for c, d in self._conns.items() if d is not None and d <= now]
            for c in late:
                self._conns[c] = math.inf  # still counted as pending until its thread has gone
            self.cut += len(late)
        for c in late:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def connections(self) -> tuple[int, int]:
        """(pending, all) connections now."""
        with self._conn_lock:
            return sum(1 for d in self._conns.values() if d is not None), len(self._conns)

    def start(self) -> threading.Thread:
        """Serve from a background thread (tests, embedding); returns the thread."""
        t = threading.Thread(target=self.serve_forever, name="argus-serve", daemon=True)
        t.start()
        return t

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        super().serve_forever(poll_interval)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._serving:  # shutdown() waits for serve_forever to return: only if it ran
            self.shutdown()
        self.server_close()

    def __enter__(self) -> "ArgusServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_server(config: ServeConfig) -> ArgusServer:
    return ArgusServer(config)


def serve(config: ServeConfig, on_ready: Any = None) -> None:
    """Run until interrupted; ``on_ready(server)`` is called once listening."""
    with make_server(config) as server:
        if on_ready is not None:
            on_ready(server)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


class _Handler(BaseHTTPRequestHandler):
    server: ArgusServer
    server_version = "argus-serve"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    # -- plumbing ----------------------------------------------------------------------
    def setup(self) -> None:
        # StreamRequestHandler.setup sets it on the socket; it reads self.timeout, so an instance value is
        # right, but typeshed declares the attribute a ClassVar
        self.timeout = self.server.config.socket_timeout_s  # type: ignore[misc]
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if not self.server.config.quiet:
            super().log_message(format, *args)

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None,
              csp: str = _JSON_CSP) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200) -> None:
        self._send(status, json.dumps(_clean(obj), default=str).encode(), "application/json")

    def _html(self, text: str, nonce: str, status: int = 200) -> None:
        self._send(status, text.encode(), "text/html; charset=utf-8",
                   csp=pages.page_csp(nonce) + "; frame-ancestors 'none'")

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        if self._path.startswith("/api/"):
            self._send(status, json.dumps({"error": message}).encode(), "application/json", headers)
        else:
            nonce = secrets.token_urlsafe(12)
            body = pages.message_page(f"{status} {HTTPStatus(status).phrase}", message, nonce)
            self._send(status, body.encode(), "text/html; charset=utf-8", headers,
                       csp=pages.page_csp(nonce) + "; frame-ancestors 'none'")

    # -- access control ----------------------------------------------------------------
    def _host_ok(self) -> bool:
        if self.server.config.token or self.server.config.insecure:
            return True
        host = (self.headers.get("Host") or "").strip()
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
        return is_loopback(name)

    def _authorized(self, query: dict[str, list[str]]) -> bool | None:
        """True: go on; False: refuse; None: a redirect that sets the cookie was sent."""
        cfg = self.server.config
        if not cfg.token:
            return True
        token = cfg.token.encode()
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip().encode(), token):
            return True
        cookie = SimpleCookie()
        try:
            cookie.load(self.headers.get("Cookie") or "")
        except Exception:  # noqa: BLE001 - one bad request must not end the server
            pass
        if COOKIE in cookie and self.server.session and \
                hmac.compare_digest(cookie[COOKIE].value.encode(), self.server.session.encode()):
            return True
        given = query.get("token")
        if given and hmac.compare_digest(given[0].encode(), token):
            rest = {k: v for k, v in query.items() if k != "token"}
            location = self._path + ("?" + urlencode(rest, doseq=True) if rest else "")
            self._send(303, b"", "text/plain", {"Location": location,
                                                "Set-Cookie": f"{COOKIE}={self.server.session}; HttpOnly; "
                                                              "SameSite=Strict; Path=/"})
            return None
        return False

    # -- dispatch ----------------------------------------------------------------------
    def do_HEAD(self) -> None:  # stdlib naming
        self.do_GET()

    def do_POST(self) -> None:
        self._path = urlsplit(self.path).path
        self._error(405, "the UI is read-only", {"Allow": "GET, HEAD"})

    do_PUT = do_DELETE = do_PATCH = do_POST

    def do_GET(self) -> None:
        split = urlsplit(self.path)
        self._path = split.path
        query = parse_qs(split.query)
        if not self._host_ok():
            self.close_connection = True  # a refused connection stays pending: it does not get to linger
            return self._error(403, "unexpected Host header: the UI answers only to a loopback host name")
        ok = self._authorized(query)
        if ok is None:
            self.server.authorised(self.connection)
            return
        if not ok:
            self.close_connection = True
            return self._error(401, "missing or wrong token: send 'Authorization: Bearer TOKEN' or open the UI "
                                    "once with ?token=TOKEN", {"WWW-Authenticate": 'Bearer realm="argus"'})
        self.server.authorised(self.connection)
        try:
            segments = self._segments(split.path)
            self._route(segments, query)
        except _NotFound as exc:
            self._error(404, str(exc) or "not found")
        except OSError:  # the client went away or stopped reading (timeout): nothing to answer
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a store a crash left behind, an analysis bug: one line, keep serving
            self.close_connection = True
            print(f"argus serve: {visible(self._path)} failed: {visible(f'{type(exc).__name__}: {exc}')}",
                  file=sys.stderr, flush=True)
            try:
                self._error(500, f"internal error: {type(exc).__name__}: {exc}")
            except OSError:
                pass

    @staticmethod
    def _segments(raw: str) -> list[str]:
        """Path segments, split *before* percent-decoding (an encoded ``/`` is not a
        separator), each decoded and refused if it could climb or name a path."""
        parts = [p for p in raw.split("/") if p != ""]
        out = []
        for p in parts:
            try:
                s = unquote(p, errors="strict")
            except UnicodeDecodeError:
                raise _NotFound("not found") from None
            if s in (".", "..") or not _SEGMENT_OK.match(s):
                raise _NotFound("not found")
            out.append(s)
        return out

    def _route(self, seg: list[str], query: dict[str, list[str]]) -> None:
        cfg = self.server.config
        nonce = secrets.token_urlsafe(12)
        fragment = query.get("fragment") == ["1"]
        wait = 0.0
        if query.get("wait"):
            try:
                wait = min(max(float(query["wait"][0]), 0.0), MAX_WAIT_S)
            except ValueError:
                raise _NotFound("wait must be a number of seconds") from None
        st = self.server.state
        if seg in ([], ["index.html"]):
            attempts = st.attempts()
            if fragment:
                return self._send(200, pages.runs_fragment(attempts, str(cfg.store)).encode(),
                                  "text/html; charset=utf-8")
            return self._html(pages.runs_page(attempts, str(cfg.store), st.runs_version(), cfg.poll_s, nonce), nonce)
        if seg == ["api", "runs"]:
            return self._json({"version": st.runs_version(), "store": str(cfg.store), "runs": [
                {"run_id": a.identity.run_id, "attempt_id": a.identity.attempt_id, "layout": str(a.layout),
                 "ranks": a.layout.world_size, "source": a.meta.get("source"), "scenario": a.meta.get("scenario"),
                 "created_ns": a.meta.get("created_ns"), "url": pages.run_url(a.identity.run_id, a.identity.attempt_id),
                 "api": pages.api_url(a.identity.run_id, a.identity.attempt_id)} for a in st.attempts()]})
        if len(seg) >= 3 and seg[0] == "run":
            run_id, attempt_id = seg[1], seg[2]
            snap, astate = self._snapshot(run_id, attempt_id, wait)
            if len(seg) == 3:
                if fragment:
                    return self._send(200, pages.run_fragment(snap, run_id, attempt_id).encode(),
                                      "text/html; charset=utf-8")
                return self._html(pages.run_page(snap, run_id, attempt_id, cfg.poll_s, nonce), nonce)
            if len(seg) == 5 and seg[3] == "incident":
                view = astate.incident(snap, seg[4])
                if fragment:
                    return self._send(200, pages.incident_fragment(snap, view, run_id, attempt_id, seg[4]).encode(),
                                      "text/html; charset=utf-8")
                return self._html(pages.incident_page(snap, view, run_id, attempt_id, seg[4], cfg.poll_s, nonce),
                                  nonce, 200 if view is not None or snap.state != "ready" else 404)
        if len(seg) >= 4 and seg[:2] == ["api", "run"]:
            return self._api_run(seg[2], seg[3], seg[4:], wait)
        if len(seg) == 5 and seg[0] == "evidence":
            return self._evidence(*seg[1:])
        if seg == ["favicon.ico"]:
            return self._send(204, b"", "image/x-icon")
        raise _NotFound("no such page")

    def _snapshot(self, run_id: str, attempt_id: str, wait: float) -> tuple[Snapshot, Any]:
        attempt = self.server.state.find(run_id, attempt_id)
        if attempt is None:
            raise _NotFound(f"no run {run_id!r} attempt {attempt_id!r} in this store")
        astate = self.server.state.state(attempt)
        return astate.snapshot(wait), astate

    def _api_run(self, run_id: str, attempt_id: str, rest: list[str], wait: float) -> None:
        snap, astate = self._snapshot(run_id, attempt_id, wait)
        base = {"run_id": run_id, "attempt_id": attempt_id, "version": snap.version, "diagnosis": snap.status_json()}
        d = snap.data
        if rest == []:
            return self._json({**(d.summary_json() if d else {}), **base})
        if rest == ["status"]:  # what pages poll: small, always 200
            return self._json({**base, "incidents": len(d.incidents) if d else 0})
        if rest == ["incidents"]:
            return self._json({**base, "ranks": d.ranks if d else None, "incidents": [
                {**v.incident, "source": v.source,
                 "url": pages.incident_url(run_id, attempt_id, v.id)} for v in (d.incidents if d else [])]})
        if len(rest) == 2 and rest[0] == "incident":
            view = astate.incident(snap, rest[1])
            if view is None:
                raise _NotFound(f"no incident {rest[1]!r} in the current diagnosis")
            return self._json({**base, "incident": pages.incident_json(view, run_id, attempt_id)})
        if rest == ["evidence"]:
            files = astate.gatherer().evidence(refresh=True)
            return self._json({**base, "files": [
                {"host": f.host, "name": f.name, "bytes": f.bytes, "window": f.window,
                 "steps": list(f.steps) if f.steps else None,
                 "url": pages.evidence_url(run_id, attempt_id, f)} for f in files]})
        raise _NotFound("no such endpoint")

    def _evidence(self, run_id: str, attempt_id: str, host: str, name: str) -> None:
        attempt = self.server.state.find(run_id, attempt_id)
        if attempt is None or host.startswith(".") or not _HOST_OK.match(host) or not _EVIDENCE_FILE.match(name):
            raise _NotFound("no such evidence file")
        path = safe_evidence_path(attempt.path, host, name, store_root=self.server.state.root)
        if path is None:
            raise _NotFound("no such evidence file")
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        filename = _HEADER_UNSAFE.sub("_", f"{host}-{name}")  # a host name must not write a header of its own
        self.send_header("Content-Disposition", f'attachment; filename="{filename}"')
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", _JSON_CSP)
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command == "HEAD":
            return
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                self.wfile.write(chunk)


def safe_evidence_path(attempt_path: Path, host: str, name: str, store_root: Path | None = None) -> Path | None:
    """``<attempt>/evidence/<host>/<name>`` if it is a regular file inside the evidence
    directory reached without any symbolic link (from ``store_root`` when given, so a linked
    attempt or run directory is refused too); None otherwise."""
    if store_root is not None and not reached_without_links(store_root, attempt_path):
        return None
    if not host or not name or any(c in s for s in (host, name) for c in ("/", "\\", "\x00")) \
            or host in (".", "..") or name in (".", ".."):
        return None
    root = attempt_path / EVIDENCE_DIR
    candidate = root / host / name
    try:
        for p in (root, root / host, candidate):
            if stat.S_ISLNK(os.lstat(p).st_mode):
                return None
        if not stat.S_ISREG(os.lstat(candidate).st_mode):
            return None
        resolved, base = candidate.resolve(strict=True), root.resolve(strict=True)
    except OSError:
        return None
    return resolved if resolved.is_relative_to(base) and resolved.parent.parent == base else None
