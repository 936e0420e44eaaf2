"""Shared test helpers: run the CLI in-process and capture its exit code and stderr."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Launched ranks import hook modules from tests/ (e.g. tests/rank_hooks.py).
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p
)


@pytest.fixture
def cli(capsys):
    """Run `sparselift ARGS…` in-process; return (exit code, stdout, stderr)."""
    from sparselift.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse
            code = e.code
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


@pytest.fixture
def write_json(tmp_path):
    def write(obj, name="spec.json") -> Path:
        p = tmp_path / name
        p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
        return p

    return write
