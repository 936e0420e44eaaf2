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
        return [
            f"plan format version {version} is newer than this SparseLift reads (version {VERSION}); "
            f"upgrade SparseLift"
        ]
    if _fast_check()(d):
        return []  # conforms; jsonschema is only needed to explain what does not
    try:
        validator = _validator()
    except (
        ImportError
    ):  # a trainer's environment without jsonschema still refuses, just less precisely
        return ["does not match plan.schema.json (install jsonschema to see where)"]
    errors = sorted(validator.iter_errors(d), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_where(d, e.absolute_path)}: {e.message}" for e in errors]


# ------------------------------------------------------------------------------------ fast path
# jsonschema walks a 1,000-table plan in ~0.3 s. The plan schema uses a small subset of JSON Schema,
# so it is compiled here, from the same file, into plain Python checks that answer only "conforms?"
# in milliseconds. A keyword outside the subset makes the whole fast path decline (always False), so
# jsonschema stays the authority: it explains every failure and decides any case the fast path declines.

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "null": lambda v: v is None,
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}
_ANNOTATIONS = {"$schema", "$id", "title", "description"}


@functools.cache
def _fast_check():
    try:
        return _compile(plan_schema())
    except NotImplementedError:
        return lambda d: False


def _compile(s: dict[str, Any]):
    checks = []
    for key, arg in s.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            kinds = [_TYPES[k] for k in ([arg] if isinstance(arg, str) else arg)]
            checks.append(lambda v, kinds=kinds: any(k(v) for k in kinds))
        elif key in ("enum", "const"):
            allowed = arg if key == "enum" else [arg]
            checks.append(
                lambda v, allowed=allowed: any(type(v) is type(a) and v == a for a in allowed)
            )
        elif key == "required":
            checks.append(
                lambda v, req=tuple(arg): not isinstance(v, dict) or all(k in v for k in req)
            )
        elif key == "properties":
            props = {k: _compile(sub) for k, sub in arg.items()}
            checks.append(
                lambda v, props=props: (
                    not isinstance(v, dict) or all(c(v[k]) for k, c in props.items() if k in v)
                )
            )
        elif key == "additionalProperties":
            if arg is True:
                continue
            if arg is not False:
                raise NotImplementedError(key)
            names = frozenset(s.get("properties", {}))
            checks.append(lambda v, names=names: not isinstance(v, dict) or names.issuperset(v))
        elif key == "items":
            item = _compile(arg)
            checks.append(lambda v, item=item: not isinstance(v, list) or all(item(x) for x in v))
        elif key in ("minItems", "maxItems", "minLength"):
            kind = str if key == "minLength" else list
            op = (lambda n, a: n >= a) if key.startswith("min") else (lambda n, a: n <= a)
            checks.append(
                lambda v, a=arg, kind=kind, op=op: not isinstance(v, kind) or op(len(v), a)
            )
        elif key in ("minimum", "maximum", "exclusiveMinimum"):
            op = {
                "minimum": lambda x, a: x >= a,
                "maximum": lambda x, a: x <= a,
                "exclusiveMinimum": lambda x, a: x > a,
            }[key]
            checks.append(lambda v, a=arg, op=op: not _TYPES["number"](v) or op(v, a))
        else:
            raise NotImplementedError(key)
    return lambda v: all(c(v) for c in checks)


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
