"""Shared pieces of the bad-input tables (test_bad_input*.py) and of tests that start from the
fixture profile: the table reader, the macro expansion, the one-line refusal check, and the
analyzed copy of that profile."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def rows(table: str) -> list[list[str]]:
    """The cells of a table of `a | b | c` lines (blank lines skipped)."""
    return [[c.strip() for c in line.split(" | ")] for line in table.strip().splitlines() if line]


def field_paths(node: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every path (keys and indices) into a decoded JSON document, the root's () first."""
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from field_paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from field_paths(v, (*path, i))


def expand(text: str, macros: dict[str, str], paths: dict[str, Path]) -> str:
    """`text` with each macro replaced, then each {name} filled from `paths`."""
    for macro, value in macros.items():
        text = text.replace(macro, value)
    return text.format(**{k: str(v) for k, v in paths.items()})


def assert_refused(code: int, err: str, needle: str) -> None:
    """The CLI refused as bad input: exit 2, one line on stderr naming `needle`, no traceback."""
    assert "Traceback" not in err, err
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert needle in err, (needle, err)


def analyzed_fixture_profile(root: Path) -> Path:
    """A copy of the tiny table-wise fixture profile in `root`, analyzed (its calibration.json
    written)."""
    from sparselift.cli import main

    prof = root / "profile"
    shutil.copytree(FIXTURES / "profile_tiny_table_wise", prof)
    assert main(["analyze", str(prof)]) == 0
    return prof
