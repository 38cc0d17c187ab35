"""Producer configuration and identity: precedence, validation, launcher variables."""

from __future__ import annotations

import pytest

from argus.errors import ConfigError
from argus.producer.config import ENV, ProducerConfig, resolve_config, resolve_identity


def test_explicit_beats_environment_beats_default():
    env = {"ARGUS_FLUSH_S": "0.25", "ARGUS_LAYOUT": "pp=2,dp=2", "ARGUS_KERNELS": "off"}
    cfg = resolve_config({"kernels": "cpu_ops"}, env)
    assert cfg.flush_interval_s == 0.25 and cfg.layout == "pp=2,dp=2" and cfg.kernels == "cpu_ops"
    assert resolve_config({}, {}).flush_interval_s == ProducerConfig().flush_interval_s


def test_every_field_has_an_environment_variable():
    from dataclasses import fields

    assert set(ENV) == {f.name for f in fields(ProducerConfig)}


@pytest.mark.parametrize("explicit, env, message", [
    ({"flush_s": 1}, {}, "unknown argus.init option 'flush_s'"),
    ({}, {"ARGUS_FLUSH_S": "soon"}, "ARGUS_FLUSH_S='soon' is not a valid float"),
    ({}, {"ARGUS_KERNELS": "gpu"}, "kernels='gpu'"),
    ({"buffer_events": 10}, {}, "buffer_events must be at least 1000"),
    ({}, {"ARGUS_MODULE_PATTERNS": "attention"}, "is not phase=word|word"),
])
def test_bad_options_name_the_problem(explicit, env, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|").replace("(", r"\(")):
        resolve_config(explicit, env)


def test_module_patterns_and_booleans_parse():
    cfg = resolve_config({}, {"ARGUS_MODULE_PATTERNS": "attn=Attention|SDPA; mlp=FFN", "ARGUS_ENABLE": "off"})
    assert cfg.module_patterns == {"attn": ("attention", "sdpa"), "mlp": ("ffn",)}
    assert cfg.enabled is False


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "job7",
      "TORCHELASTIC_RESTART_COUNT": "2"}, (3, 8, 1, "job7", "2")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "991"}, (5, 16, 1, "991", "0")),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}, (2, 4, 2, "run", "0")),
    ({}, (0, 1, 0, "run", "0")),
])
def test_identity_from_launchers(env, expected):
    ident = resolve_identity(ProducerConfig(), {**env, "ARGUS_HOST": "node-a"})
    assert (ident.rank, ident.world_size, ident.local_rank, ident.run_id, ident.attempt_id) == expected
    assert ident.host == "node-a"


def test_rank_outside_world_is_an_error():
    with pytest.raises(ConfigError, match="rank 4 is outside a world of 4"):
        resolve_identity(ProducerConfig(), {"RANK": "4", "WORLD_SIZE": "4"})


def test_layout_from_megatron_flags_and_config(tmp_path):
    from argus.producer.runtime import make_layout

    argv = ["pretrain_gpt.py", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size=4", "--bf16"]
    layout = make_layout(ProducerConfig(), 32, argv)
    assert (layout.tp, layout.pp, layout.dp) == (2, 4, 4)
    cfg = tmp_path / "megatron.yaml"
    cfg.write_text("tensor_model_parallel_size: 2  # TP\npipeline_model_parallel_size: 2\n"
                   "expert_model_parallel_size: 2\nseq_length: 4096\n")
    layout = make_layout(ProducerConfig(layout=f"megatron:{cfg}"), 32, [])
    assert (layout.tp, layout.pp, layout.ep, layout.dp) == (2, 2, 2, 4)
    assert make_layout(ProducerConfig(), 8, ["train.py"]).dp == 8  # pure data parallel by default
    with pytest.raises(ConfigError, match="cannot read the Megatron config"):
        make_layout(ProducerConfig(layout="megatron:/nonexistent.json"), 8, [])


def test_every_variable_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "producer.md").read_text()
    missing = [var for var in ENV.values() if f"`{var}`" not in doc]
    assert not missing, f"docs/producer.md lacks {missing}"


def test_a_run_id_given_to_every_rank_is_used_as_is():
    asked: list[str] = []
    for env in ({"ARGUS_RUN_ID": "given"}, {"SLURM_JOB_ID": "given", "ARGUS_RUN_ID_PROPOSAL": "run-1"}):
        ident = resolve_identity(resolve_config({}, env), env, agree=lambda p: asked.append(p) or "other")
        assert ident.run_id == "given"
    assert asked == []


def test_otherwise_the_ranks_agree_on_one_proposal():
    """Each host's ``argus run`` proposes its own start time; what the job's store returns is the run."""
    agreed: dict[str, str] = {}

    def agree(proposal: str) -> str:  # first proposal wins, as compare_set on the job's store does
        return agreed.setdefault("id", proposal)

    ids = [resolve_identity(resolve_config({}, env), env, agree=agree).run_id for env in (
        {"ARGUS_RUN_ID_PROPOSAL": "run-20261202-080127"}, {"ARGUS_RUN_ID_PROPOSAL": "run-20261202-080128"},
        {"TORCHELASTIC_RUN_ID": "none"})]
    assert ids == ["run-20261202-080127"] * 3
    # torchrun's static rendezvous names every job "none": never a run id of its own
    assert resolve_identity(ProducerConfig(), {"TORCHELASTIC_RUN_ID": "none"}).run_id == "run"
