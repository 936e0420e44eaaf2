"""Validate a decoded plan against `plan.schema.json`, reporting every violation with its path.

A file that is not a SparseLift plan, or is from a newer SparseLift, gets that one clear message
instead of a list of schema errors.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

from sparselift.plans.types import FORMAT, VERSION


@functools.cache
def plan_schema() -> dict[str, Any]:
    """The decoded `plan.schema.json` shipped with the package."""
    return json.loads(resources.files(__package__).joinpath("plan.schema.json").read_text())


@functools.cache
def _validator() -> Any:
    import jsonschema

    schema = plan_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_problems(d: Any) -> list[str]:
    """Every way `d` breaks the plan schema of this version, each with its JSON path.

    Args:
        d: a decoded JSON document.
    Returns:
        [] if `d` conforms; a single message if it is not a SparseLift plan or is of a newer
        version; else one message per violation (one generic message if jsonschema, which
        explains violations, is not installed).
    """
    if not isinstance(d, dict):
        return ["not a SparseLift plan: the file is not a JSON object"]
    if d.get("format") != FORMAT:
        return [f"not a SparseLift plan: format is {d.get('format')!r}, expected {FORMAT!r}"]
    version = d.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        return [
            f"plan format version {version} is newer than this SparseLift reads "
            f"(version {VERSION}); upgrade SparseLift"
        ]
    if _fast_check()(d):
        return []  # conforms; jsonschema is only needed to explain what does not
    try:
        validator = _validator()
    except ImportError:  # a trainer's environment without jsonschema still refuses, less precisely
        return ["does not match plan.schema.json (install jsonschema to see where)"]
    errors = sorted(validator.iter_errors(d), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(d, e.absolute_path)}: {e.message}" for e in errors]


# ------------------------------------------------------------------------------------ fast path
# jsonschema is slow on a plan of a thousand tables. The plan schema uses a small subset of JSON
# Schema, so it is compiled here, from the same file, into plain Python checks that answer only
# "conforms?". A keyword outside the subset makes the whole fast path decline (always False), so
# jsonschema stays the authority: it explains every failure and decides any case declined here.

Check = Callable[[Any], bool]

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}
_ANNOTATIONS = {"$schema", "$id", "title", "description"}
_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {
    "minimum": lambda x, a: x >= a,
    "maximum": lambda x, a: x <= a,
    "exclusiveMinimum": lambda x, a: x > a,
}


@functools.cache
def _fast_check() -> Check:
    try:
        return _compile(plan_schema())
    except NotImplementedError:
        return lambda d: False


def _compile(s: dict[str, Any]) -> Check:
    """One check for a (sub)schema: all of its keywords' checks must pass."""
    checks = [_keyword(key, arg, s) for key, arg in s.items() if key not in _ANNOTATIONS]
    return lambda v: all(c(v) for c in checks)


def _keyword(key: str, arg: Any, s: dict[str, Any]) -> Check:
    """The check of one keyword of schema `s`; NotImplementedError outside the subset compiled."""
    if key == "type":
        kinds = [_TYPES[k] for k in ([arg] if isinstance(arg, str) else arg)]
        return lambda v: any(k(v) for k in kinds)
    if key in ("enum", "const"):
        allowed = arg if key == "enum" else [arg]
        return lambda v: any(type(v) is type(a) and v == a for a in allowed)
    if key == "required":
        required = tuple(arg)
        return lambda v: not isinstance(v, dict) or all(k in v for k in required)
    if key == "properties":
        props = {k: _compile(sub) for k, sub in arg.items()}
        return lambda v: not isinstance(v, dict) or all(c(v[k]) for k, c in props.items() if k in v)
    if key == "additionalProperties" and arg is True:
        return lambda v: True
    if key == "additionalProperties" and arg is False:
        names = frozenset(s.get("properties", {}))
        return lambda v: not isinstance(v, dict) or names.issuperset(v)
    if key == "additionalProperties" and isinstance(arg, dict):  # every other member's schema
        known, member = frozenset(s.get("properties", {})), _compile(arg)
        return lambda v: (
            not isinstance(v, dict) or all(member(x) for k, x in v.items() if k not in known)
        )
    if key == "items":
        item = _compile(arg)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if key == "minLength":
        return lambda v: not isinstance(v, str) or len(v) >= arg
    if key in ("minItems", "maxItems"):
        length_op = _BOUNDS["minimum" if key == "minItems" else "maximum"]
        return lambda v: not isinstance(v, list) or length_op(len(v), arg)
    if key in _BOUNDS:
        op = _BOUNDS[key]
        return lambda v: not _TYPES["number"](v) or op(v, arg)
    raise NotImplementedError(key)


def _where(d: Any, path: Sequence[str | int]) -> str:
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
