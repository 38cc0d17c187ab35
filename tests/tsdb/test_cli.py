"""The command line: TSDB options reach the processor, and bad ones fail before it starts."""

from __future__ import annotations

from argus.cli.main import build_parser, main


def test_processor_refuses_a_bad_remote_write_url(tmp_path, capsys):
    assert main(["processor", "--store", str(tmp_path / "s"), "--socket", str(tmp_path / "p.sock"),
                 "--remote-write", "localhost:8428"]) == 2
    assert "remote-write URL 'localhost:8428'" in capsys.readouterr().err
    assert not (tmp_path / "p.sock").exists()


def test_argus_run_passes_remote_write_to_its_processor():
    args = build_parser().parse_args(["run", "--remote-write", "http://a:1/api/v1/write", "--remote-write",
                                      "http://b:2/api/v1/write", "--remote-write-job", "llm", "--", "true"])
    assert args.remote_write == ["http://a:1/api/v1/write", "http://b:2/api/v1/write"]
    assert args.remote_write_job == "llm"
