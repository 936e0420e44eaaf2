"""Read the JSON files that cross stage boundaries, with one-line errors that name the file.

Every such file carries `format` and an integer `version`; checking both here keeps the message the
same whichever stage reads the file (a calibration is read by the optimizer and by notebooks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparselift.errors import UserError


def read_json(path: str | Path, what: str) -> Any:
    """Decoded JSON of `path`; UserError if it is missing, unreadable or malformed."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"{p}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{p}: cannot read {what} ({e.__class__.__name__})") from None
    except json.JSONDecodeError as e:
        raise UserError(
            f"{p}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise UserError(f"{p}: unreadable JSON: {str(e).split(';')[0]}") from None


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
