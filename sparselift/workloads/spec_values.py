"""Typed readers of a decoded workload spec: each value checked, or one line naming the file,
the table and the key (`spec.parse_workload` reads every key through them)."""

from __future__ import annotations

import math
from typing import Any

from sparselift.errors import UserError


def get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """`d[key]`, which must be of `kind` (never a bool); UserError naming `where` otherwise."""
    if key not in d:
        raise UserError(f"{where}: missing key {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise UserError(f"{where}: {key!r} must be {kindname_of(kind)}, got {shown(v)}")
    return v


def kindname_of(kind: type | tuple[type, ...]) -> str:
    if kind == (int, float):
        return "a number"
    names = {
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return " or ".join(names[k] for k in (kind if isinstance(kind, tuple) else (kind,)))


def shown(v: Any) -> str:
    """A value for a message, short even when it is an integer of hundreds of digits."""
    if isinstance(v, int) and not isinstance(v, bool):
        text = f"{v:,}"
        return text if len(text) <= 40 else f"an integer of {len(str(abs(v)))} digits"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def format_limit(n: int) -> str:
    """An integer limit for people: "64", "65,536 (2^16)"."""
    is_power_of_two = n >= 1024 and n & (n - 1) == 0
    return f"{n:,} (2^{n.bit_length() - 1})" if is_power_of_two else f"{n:,}"


def integer(d: dict[str, Any], key: str, where: str, high: int, default: int | None = None) -> int:
    """`d[key]` as an integer in 1..high (`default` when absent, if given)."""
    if key not in d and default is not None:
        return default
    v = get(d, key, int, where)
    if not 1 <= v <= high:
        raise UserError(
            f"{where}: {key} must be an integer in 1..{format_limit(high)}, got {shown(v)}"
        )
    return v


def number(
    d: dict[str, Any], key: str, where: str, low: float, high: float, default: float
) -> float:
    """`d[key]` as a finite number in low..high (`default` when absent)."""
    if key not in d:
        return default
    raw = get(d, key, (int, float), where)
    v = float(raw) if -high <= raw <= high else math.inf  # an int too large for a float: inf
    if not (math.isfinite(v) and low <= v <= high):
        raise UserError(f"{where}: {key} must be a number in {low:g}..{high:g}, got {shown(raw)}")
    return v


def name_of(d: dict[str, Any], key: str, where: str) -> str:
    v = get(d, key, str, where)
    if not v:
        raise UserError(f"{where}: {key!r} must be a non-empty string")
    return v
