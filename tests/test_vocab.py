"""The shared vocabulary: a leaf module, and the one definition its old homes re-export."""

import ast
import sys
from pathlib import Path

import argus.vocab as vocab


def test_vocab_imports_only_the_standard_library():
    tree = ast.parse(Path(vocab.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert {m.split(".")[0] for m in imported} <= set(sys.stdlib_module_names) | {"__future__"}


def test_old_import_paths_name_the_same_enums():
    from argus.analysis.evidence import EvidenceKind, Level
    from argus.topology import GroupKind

    assert (EvidenceKind, Level, GroupKind) == (vocab.EvidenceKind, vocab.Level, vocab.GroupKind)


def test_members_are_their_strings():
    """What lets members replace the literals: equal, same hash, same JSON, same text."""
    import json

    assert vocab.GroupKind.DP == "dp" and hash(vocab.GroupKind.DP) == hash("dp")
    assert {"dp": 1}[vocab.GroupKind.DP] == 1
    assert json.dumps({"kind": vocab.EvidenceKind.BUSY_OUTLIER}) == '{"kind": "busy_outlier"}'
    assert f"{vocab.PhaseCategory.COMM}-x" == "comm-x"
