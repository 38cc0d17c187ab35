from __future__ import annotations

import http.client
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from argus.serve import ArgusServer, ServeConfig


class Client:
    """Raw HTTP (``http.client`` sends the path exactly as given: no ``..`` normalisation)."""

    def __init__(self, server: ArgusServer):
        self.server = server

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=90)
        try:
            conn.request("GET", path, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def json(self, path: str, status: int = 200, **kw: Any) -> dict:
        code, _, body = self.get(path, **kw)
        assert code == status, (code, body[:300])
        return json.loads(body)


@pytest.fixture
def serve():
    """``with serve(store_root, **config) as client:`` — a real server on an ephemeral port."""

    @contextmanager
    def start(store: Path, **cfg: Any) -> Iterator[Client]:
        with ArgusServer(ServeConfig(store=store, port=0, **cfg)) as server:
            server.start()
            yield Client(server)

    return start
