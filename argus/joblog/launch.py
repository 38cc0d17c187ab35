"""What a launch command says about its ranks: where a node's local ranks sit among the job's.

torchrun tees each worker's output with ``[<role><local rank>]:`` (``[default0]:``), the rank on
the node, not in the job. The command says how they map when it says enough: ``--standalone``
or one node (``--nnodes 1``) makes local ranks global; ``--node-rank K`` with a fixed
``--nproc-per-node P`` puts local rank 0 at ``K × P``. Anything else (an elastic range of nodes,
``--nproc-per-node gpu``, a rendezvous that assigns node ranks) leaves them local."""

from __future__ import annotations

__all__ = ["local_rank_offset"]

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def _value(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return None


def local_rank_offset(cmd: list[str]) -> int | None:
    """The global rank of this node's local rank 0 under ``cmd``, or None where it does not say."""
    at = next((i for i, a in enumerate(cmd) if a.rsplit("/", 1)[-1] in _LAUNCHERS or a in _LAUNCHERS), None)
    if at is None:
        return None
    args: list[str] = []
    for a in cmd[at + 1:]:  # the launcher's own options end at the script or module
        if not a.startswith("-") and (not args or not args[-1].startswith("-") or "=" in args[-1]):
            break
        args.append(a)
    if "--standalone" in args:
        return 0
    nnodes = _value(args, "--nnodes")
    if nnodes is not None and nnodes.split(":")[-1] == "1" and nnodes.split(":")[0] == "1":
        return 0
    node, nproc = _value(args, "--node-rank", "--node_rank"), _value(args, "--nproc-per-node", "--nproc_per_node")
    if node is not None and nproc is not None and node.isdigit() and nproc.isdigit():
        return int(node) * int(nproc)
    return None
