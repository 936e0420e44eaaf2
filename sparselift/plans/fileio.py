"""Read and write plan files: validated on the way in, deterministic bytes and atomic on the way out."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from sparselift.plans.errors import PlanError
from sparselift.plans.plan import Plan

WIDTH = 100


def dumps(plan: Plan) -> bytes:
    """Canonical bytes: fixed key order and float precision, trailing newline.

    Anything that fits in WIDTH columns stays on one line (a table's fingerprint, a shard), so a plan
    reads and diffs line by line.
    """
    return (_format(plan.to_dict(), 0) + "\n").encode()


def _format(v: object, indent: int) -> str:
    compact = json.dumps(v, ensure_ascii=True, allow_nan=False, separators=(", ", ": "))
    if not isinstance(v, (dict, list)) or not v or indent + len(compact) <= WIDTH:
        return compact
    pad = " " * (indent + 1)
    if isinstance(v, dict):
        items = [f"{pad}{json.dumps(k)}: {_format(x, indent + 1)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _format(x, indent + 1) for x in v]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def loads(data: str | bytes, source: str = "<plan>") -> Plan:
    try:
        d = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = (
            f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        )
        raise PlanError(source, f"malformed JSON{where}: {getattr(e, 'msg', e)}") from None
    return Plan.from_dict(d, source)


def load(path: str | os.PathLike) -> Plan:
    """Read, schema-validate and consistency-check a plan file; PlanError names the file."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise PlanError(source, f"cannot read the plan: {e.strerror or e}") from None
    return loads(data, source)


def save(plan: Plan, path: str | os.PathLike) -> None:
    """Write atomically (temp file + rename): readers never see half a plan; equal plans, equal bytes.

    The plan is re-validated first, so no invalid plan is ever written.
    """
    data = dumps(plan)
    Plan.from_dict(json.loads(data), str(path))
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(
            tmp, 0o666 & ~umask
        )  # mkstemp makes 0600: a trainer running as another user must read it
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
