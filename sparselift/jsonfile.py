"""Read the JSON files that cross stage boundaries, with one-line errors that name the file.

Every such file carries `format` and an integer `version`; checking both here keeps the message the
same whichever stage reads the file (a calibration is read by the optimizer and by notebooks).
The field readers check one optional field of a decoded object, naming the file (`where`), the
path to the object (`at`) and the field in their message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparselift.errors import UserError

# The most seconds a measured duration may hold (a day): beyond it a file's number is no
# measurement, and times in integer nanoseconds would overflow the solver's 64 bits.
MAX_SECONDS = 86_400.0


def read_json(path: str | Path, what: str) -> Any:
    """Decoded JSON of `path`; UserError if it is missing, unreadable or malformed."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UserError(f"{p}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read {what} ({e.__class__.__name__})") from None
    return loads(text, str(p))


def loads(text: str, where: str) -> Any:
    """Decoded JSON of `text`; UserError naming `where` (and the line) if it is malformed."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{where}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise UserError(f"{where}: unreadable JSON: {str(e).split(';')[0]}") from None


def read_versioned(path: str | Path, fmt: str, version: int, what: str) -> dict[str, Any]:
    """`read_json`, then the object's `format` must be `fmt` and its `version` `version`."""
    d = read_json(path, what)
    if not isinstance(d, dict) or d.get("format") != fmt:
        raise UserError(f'{path}: not a {what} (expected "format": "{fmt}")')
    if d.get("version") != version:
        raise UserError(
            f"{path}: unsupported {what} version {d.get('version')!r} (expected {version})"
        )
    return d


def is_number(v: Any) -> bool:
    """Whether `v` is a JSON number (an int or a float, not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def optional(doc: Mapping[str, Any], key: str, kind: type, where: str, at: str = "") -> Any:
    """doc[key] if present and not null, checked to be a `kind` (str or int); else None."""
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, kind) or isinstance(v, bool):
        raise UserError(f"{where}: {at}{key} must be {'a string' if kind is str else 'an integer'}")
    return v


def optional_bool(doc: Mapping[str, Any], key: str, where: str) -> bool | None:
    """doc[key] if present and not null, checked to be true or false; else None."""
    v = doc.get(key)
    if v is not None and not isinstance(v, bool):
        raise UserError(f"{where}: {key} must be true or false")
    return v


def optional_number(doc: Mapping[str, Any], key: str, where: str, at: str = "") -> float | None:
    """float(doc[key]) if present and not null, else None; UserError if it is not a finite
    number (Python's JSON reader takes NaN and Infinity, which no writer here writes)."""
    v = _number(doc, key, where, at)
    if v is not None and not math.isfinite(v):
        raise UserError(f"{where}: {at}{key} must be a finite number, got {v}")
    return v


def optional_seconds(doc: Mapping[str, Any], key: str, where: str, at: str = "") -> float | None:
    """`optional_number`, and UserError unless it is ≥ 0 and at most `MAX_SECONDS`."""
    v = _number(doc, key, where, at)
    if v is not None and not 0 <= v <= MAX_SECONDS:
        raise UserError(
            f"{where}: {at}{key} must be a finite number >= 0 (seconds, at most "
            f"{MAX_SECONDS:g}), got {v:g}"
        )
    return v


def _number(doc: Mapping[str, Any], key: str, where: str, at: str) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if not is_number(v):
        raise UserError(f"{where}: {at}{key} must be a number")
    return float(v)


def strings(doc: Mapping[str, Any], key: str, where: str, at: str = "") -> list[str]:
    """doc[key] as a list of strings; [] if absent or null; UserError if it is something else."""
    v = doc.get(key)
    if v is None:
        return []
    if not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
        raise UserError(f"{where}: {at}{key} must be a list of strings")
    return list(v)
