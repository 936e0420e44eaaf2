"""Read and write plan files: validated on the way in; deterministic bytes, atomic on the way out.

The atomic write is a copy of `sparselift.atomic.write_bytes` (this package imports nothing else of
ours), with the same refusals: "cannot write <path>: <why>", and nothing left behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from sparselift.plans.errors import PlanError, PlanWriteError
from sparselift.plans.plan import Plan

WIDTH = 100  # a JSON value that fits in this many columns stays on one line


# Lists written as rows of numbers filling WIDTH columns rather than one number per line.
PACKED = frozenset({"hot_ids"})


def dumps(plan: Plan) -> bytes:
    """The plan file's canonical bytes: fixed key order and float precision, trailing newline.

    Anything that fits in WIDTH columns stays on one line (a table's fingerprint, a shard), so a
    plan reads and diffs line by line; a split's hot ids fill rows of WIDTH columns. Equal plans
    give equal bytes.
    """
    return (_format(plan.to_dict(), 0) + "\n").encode()


def _format(v: object, indent: int, key: str | None = None) -> str:
    compact = json.dumps(v, ensure_ascii=True, allow_nan=False, separators=(", ", ": "))
    if not isinstance(v, (dict, list)) or not v or indent + len(compact) <= WIDTH:
        return compact
    pad = " " * (indent + 1)
    if isinstance(v, dict):
        items = [f"{pad}{json.dumps(k)}: {_format(x, indent + 1, k)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if key in PACKED:
        return (
            "[\n"
            + ",\n".join(_packed_rows([json.dumps(x) for x in v], pad))
            + "\n"
            + " " * indent
            + "]"
        )
    items = [pad + _format(x, indent + 1) for x in v]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def _packed_rows(words: list[str], pad: str) -> list[str]:
    """`words` as comma-separated rows of at most WIDTH columns, each starting with `pad`."""
    rows: list[str] = []
    line = ""
    for w in words:
        if line and len(pad) + len(line) + len(w) + 3 > WIDTH:
            rows.append(pad + line)
            line = ""
        line = f"{line}, {w}" if line else w
    return [*rows, pad + line]


def loads(data: str | bytes, source: str = "<plan>") -> Plan:
    """Decode, schema-validate and consistency-check a plan file's contents.

    Args:
        data: the file's bytes or text.
        source: where they came from, named in every message.
    Raises:
        PlanError: malformed JSON (with line and column), or every problem of the plan.
    """
    try:
        d = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = (
            f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        )
        raise PlanError(source, f"malformed JSON{where}: {getattr(e, 'msg', e)}") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise PlanError(source, f"unreadable JSON: {str(e).split(';')[0]}") from None
    return Plan.from_dict(d, source)


def load(path: str | os.PathLike[str]) -> Plan:
    """Read, schema-validate and consistency-check a plan file.

    Raises:
        PlanError: naming the file: it cannot be read (missing, a directory, …), or `loads` refuses
            its contents.
    """
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise PlanError(source, f"cannot read the plan: {e.strerror or e}") from None
    return loads(data, source)


def save(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write `plan` to `path` atomically (temp file + rename): readers never see half a plan.

    The plan is re-validated first, so no invalid plan is ever written; equal plans, equal bytes.

    Raises:
        PlanError: the plan is invalid (nothing is written).
        PlanWriteError: the path cannot be written ("cannot write <path>: <why>"; nothing is left).
    """
    data = dumps(plan)
    Plan.from_dict(json.loads(data), str(path))
    _write_atomic(Path(path), data)


def unwritable_reason(path: Path) -> str | None:
    """Why a file cannot be created at `path`, without touching the disk; None if it can.

    Same rules as `sparselift.atomic.unwritable_reason`: a missing folder is refused, not created.
    """
    if path.is_dir():
        return "it is a directory"
    for folder in path.parents:
        if folder.exists():
            if not folder.is_dir():
                return f"{folder} is not a directory"
            break
    if not path.parent.is_dir():
        return f"{path.parent} does not exist"
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    reason = unwritable_reason(path)
    if reason is not None:
        raise PlanWriteError(str(path), reason)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise PlanWriteError(str(path), e.strerror or str(e)) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        # mkstemp makes 0600; the usual mode lets a trainer running as another user read the plan
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise PlanWriteError(str(path), e.strerror or str(e)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
