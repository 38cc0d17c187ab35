"""Before authentication a connection is cheap to refuse: idle and slow-drip clients are cut
at a deadline, over the cap a new connection gets an immediate 503, and a client that
already authenticated keeps working throughout. Real server, real sockets."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from tests.report.helpers import sim, store_root

# Generous against a busy 2-core machine: a cut that does not come within this is a hang.
_WAIT_S = 30.0


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=_WAIT_S)
    return s


def _closed_by_server(s: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (raises on our timeout)."""
    got = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def _wait_for(pred, what: str) -> None:
    deadline = time.monotonic() + _WAIT_S
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def store(simulated):
    return store_root(sim(simulated, "healthy")[0])


def test_an_idle_connection_is_cut_at_the_pending_deadline(store, serve):
    with serve(store, pending_deadline_s=0.5) as c:
        idle = _connect(c.server.port)
        t0 = time.monotonic()
        assert _closed_by_server(idle) == b""  # nothing sent, nothing answered: just closed
        assert time.monotonic() - t0 < _WAIT_S
        _wait_for(lambda: c.server.connections == (0, 0), "the cut connection's slot was not freed")
        assert c.server.cut == 1
        assert c.get("/api/runs")[0] == 200


def test_a_slow_drip_of_header_bytes_is_cut_however_steady(store, serve):
    with serve(store, pending_deadline_s=0.5) as c:
        s = _connect(c.server.port)
        s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.settimeout(0.1)
        sent, closed = 0, False
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:  # one byte each 0.1 s: never a per-read timeout
            try:
                s.sendall(b"X")
                sent += 1
                if s.recv(4096) == b"":
                    closed = True
                    break
            except socket.timeout:
                continue
            except OSError:  # reset or broken pipe: the server cut us
                closed = True
                break
        assert closed, f"a client that never finishes its headers was kept for {_WAIT_S} s ({sent} bytes)"
        assert c.server.cut == 1


def test_over_the_cap_new_connections_get_503_while_an_authorised_one_keeps_working(store, serve):
    with serve(store, max_pending=4, pending_deadline_s=3.0) as c:
        kept = http.client.HTTPConnection("127.0.0.1", c.server.port, timeout=_WAIT_S)
        kept.request("GET", "/api/runs")
        r = kept.getresponse()
        assert r.status == 200
        r.read()
        idle = [_connect(c.server.port) for _ in range(4)]
        _wait_for(lambda: c.server.connections[0] == 4, "the idle connections were not accepted")
        t0 = time.monotonic()
        refused = _connect(c.server.port)
        answer = _closed_by_server(refused)
        assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After" in answer
        assert time.monotonic() - t0 < 3.0  # at once, not at the idle ones' deadline
        assert c.server.refused == 1
        kept.request("GET", "/api/runs")  # the authorised keep-alive connection is not pending
        r = kept.getresponse()
        assert r.status == 200 and b'"runs"' in r.read()
        for s in idle:  # then the deadline frees the slots, and new clients get in again
            assert _closed_by_server(s) == b""
        _wait_for(lambda: c.server.connections[0] == 0, "pending slots were not freed")
        assert c.get("/api/runs")[0] == 200
        kept.close()


def test_a_wrong_token_ends_the_connection_and_leaves_it_pending(store, serve):
    token = "s3cret-token-0123456789"
    with serve(store, token=token, max_pending=2, pending_deadline_s=30.0) as c:
        s = _connect(c.server.port)
        s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer guess-guess-guess\r\n\r\n")
        answer = _closed_by_server(s)  # closed after the 401: no second guess on the same connection
        assert answer.startswith(b"HTTP/1.1 401")
        assert c.get("/api/runs", headers={"Authorization": f"Bearer {token}"})[0] == 200


def test_the_connection_limits_are_validated(tmp_path):
    from argus.errors import ConfigError
    from argus.serve import ServeConfig

    for bad in ({"max_pending": 0}, {"max_pending": 200, "max_connections": 100}, {"pending_deadline_s": 0.0},
                {"socket_timeout_s": -1.0}):
        with pytest.raises(ConfigError):
            ServeConfig(store=tmp_path, **bad)
