"""Who may talk to the server: loopback by default, a token for anything else."""

import pytest

from argus.errors import ConfigError
from argus.serve import ServeConfig, is_loopback
from tests.report.helpers import sim, store_root


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "example.org"])
def test_binding_beyond_loopback_needs_a_token_or_insecure(tmp_path, host):
    with pytest.raises(ConfigError, match="--token"):
        ServeConfig(store=tmp_path, host=host)
    ServeConfig(store=tmp_path, host=host, token="t0ken-t0ken-t0ken")
    ServeConfig(store=tmp_path, host=host, insecure=True)


def test_loopback_names_and_bad_settings():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "evil.example"))
    with pytest.raises(ConfigError, match="port"):
        ServeConfig(store=".", port=70000)
    with pytest.raises(ConfigError, match="token"):
        ServeConfig(store=".", token=" ")


def test_token_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ARGUS_SERVE_TOKEN", "from-env-0123456789")
    assert ServeConfig.from_env(store=tmp_path, host="0.0.0.0").token == "from-env-0123456789"
    assert ServeConfig.from_env(store=tmp_path, token="explicit-0123456789").token == "explicit-0123456789"


def test_every_request_needs_the_token_header_or_the_cookie_a_token_link_sets(simulated, serve):
    attempt, _ = sim(simulated, "healthy")
    with serve(store_root(attempt), token="s3cret-token-0123") as c:
        code, headers, _ = c.get("/api/runs")
        assert code == 401 and headers["www-authenticate"].startswith("Bearer")
        assert c.get("/api/runs", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert c.get("/evidence/x/0/h/000000001-ab.pftrace")[0] == 401  # checked before anything else
        assert c.get("/api/runs", headers={"Authorization": "Bearer s3cret-token-0123"})[0] == 200
        assert c.get("/?token=wrong")[0] == 401
        code, headers, _ = c.get("/?token=s3cret-token-0123&x=1")
        assert code == 303 and headers["location"] == "/?x=1"  # the token leaves the address bar
        cookie = headers["set-cookie"].split(";")[0]
        assert "s3cret-token-0123" not in cookie and "HttpOnly" in headers["set-cookie"]
        assert c.get("/api/runs", headers={"Cookie": cookie})[0] == 200
        assert c.get("/api/runs", headers={"Cookie": "argus_session=forged"})[0] == 401


def test_without_a_token_only_loopback_host_names_are_answered(simulated, serve):
    attempt, _ = sim(simulated, "healthy")
    with serve(store_root(attempt)) as c:
        assert c.get("/api/runs", headers={"Host": "evil.example:8765"})[0] == 403  # DNS rebinding
        assert c.get("/api/runs", headers={"Host": f"localhost:{c.server.port}"})[0] == 200
        assert c.get("/api/runs")[0] == 200


def test_the_ui_is_read_only(simulated, serve):
    import http.client

    attempt, _ = sim(simulated, "healthy")
    with serve(store_root(attempt)) as c:
        conn = http.client.HTTPConnection("127.0.0.1", c.server.port, timeout=10)
        conn.request("POST", "/api/runs", body=b"{}")
        r = conn.getresponse()
        assert r.status == 405 and r.getheader("Allow") == "GET, HEAD"
        conn.close()


@pytest.mark.parametrize("token", ["x", "s3cret", "fifteen-chars-x", "sixteen chars ok", "sixteen-chars-\u00e9k"])
def test_short_or_unprintable_tokens_are_refused_with_a_clear_error(tmp_path, capsys, token):
    from argus.cli.main import main

    with pytest.raises(ConfigError, match="--token"):
        ServeConfig(store=tmp_path, token=token)
    assert main(["serve", str(tmp_path), "--port", "0", "--token", token]) == 2
    err = capsys.readouterr().err
    assert err.startswith("argus: error: --token") and "Traceback" not in err and err.count("\n") == 1
    ServeConfig(store=tmp_path, token="sixteen-chars-ok")
