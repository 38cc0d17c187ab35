"""The published diagnosis schema (docs/schemas/diagnosis.schema.json), for tests that check
every document Argus emits against it."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "schemas" / "diagnosis.schema.json"


@lru_cache(maxsize=1)
def _validator() -> Any:
    import jsonschema

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate(doc: dict) -> None:
    """Raise AssertionError listing every place ``doc`` breaks the schema."""
    errors = sorted(_validator().iter_errors(json.loads(json.dumps(doc, default=str))), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path)) or '(top)'}: {e.message[:200]}" for e in errors[:10])
