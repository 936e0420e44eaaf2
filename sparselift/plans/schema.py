"""Validate a decoded plan against `plan.schema.json`, reporting every violation with its path.

A file that is not a SparseLift plan, or is from a newer SparseLift, gets that one clear message
instead of a list of schema errors.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from sparselift.plans.plan import FORMAT, VERSION


@functools.cache
def plan_schema() -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("plan.schema.json").read_text())


@functools.cache
def _validator():
    import jsonschema

    schema = plan_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_problems(d: Any) -> list[str]:
    """[] if `d` is a valid plan document of this version, else one message per violation."""
    if not isinstance(d, dict):
        return ["not a SparseLift plan: the file is not a JSON object"]
    if d.get("format") != FORMAT:
        return [f"not a SparseLift plan: format is {d.get('format')!r}, expected {FORMAT!r}"]
    version = d.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        return [f"plan format version {version} is newer than this SparseLift reads (version {VERSION}); "
                f"upgrade SparseLift"]
    errors = sorted(_validator().iter_errors(d), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(d, e.absolute_path)}: {e.message}" for e in errors]


def _where(d: Any, path) -> str:
    """`tables[3] ('t3').ranks[0]`: a JSON path, naming tables where it can."""
    out = ""
    node = d
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
            try:
                node = node[p]
            except (IndexError, KeyError, TypeError):
                node = None
            if isinstance(node, dict) and isinstance(node.get("name"), str):
                out += f" ({node['name']!r})"
        else:
            out += f".{p}" if out else str(p)
            node = node.get(p) if isinstance(node, dict) else None
    return out or "plan"
