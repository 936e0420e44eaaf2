"""Seeded mutations of a real profile's files: every command that reads them either runs or
refuses in one line (exit 2), never with a traceback.

The hand-written tables (test_bad_input*.py) hold the cases someone thought of; these draw
mutations of the files that cross stage boundaries (a field deleted, or set to a value of
another type, sign or size) and run the commands that read each file on them.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from bad_input_cases import analyzed_fixture_profile, field_paths

VALUES = [-1, 0, 1, 2.5, "x", "", None, True, [], {}, [1], {"a": 1}, 1e9, 1e15, math.inf, 1e300]
CASES = 20  # per file and seed
OPTIMIZE = ["optimize", "--no-baseline", "--time-limit", "1"]


def mutated(doc: Any, rng: random.Random) -> tuple[Any, tuple]:
    """`doc` with one field, drawn by `rng`, deleted or set to a value of `VALUES`."""
    out = copy.deepcopy(doc)
    path = rng.choice([p for p in field_paths(out) if p])
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    if rng.random() < 0.25 and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(VALUES)
    return out, path


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> dict[str, Path]:
    """The fixture profile analyzed, and a plan made from it (for `plan check`)."""
    from sparselift.cli import main

    root = tmp_path_factory.mktemp("fuzz")
    prof = analyzed_fixture_profile(root)
    plan = root / "plan.json"
    argv = [*OPTIMIZE, "--profile", prof, "--out", plan]
    assert main([str(a) for a in argv]) == 0
    return {"prof": prof, "plan": plan}


def _commands(d: Path, prof: Path, plan: Path, out: Path) -> dict[str, list[Any]]:
    return {
        "analyze": ["analyze", d, "--out", out / "a"],
        "optimize": [*OPTIMIZE, "--profile", d, "--out", out / "p.json"],
        "compare": ["compare", prof, d],
        "check": ["plan", "check", plan, "--profile", d, "--time-limit", "1"],
    }


READERS = {  # file → the commands that read it
    "manifest.json": ("analyze", "optimize", "compare", "check"),
    "calibration.json": ("optimize", "check"),
    "access_stats.parquet": ("optimize", "check"),
}


def _mutate_stats(src: Path, dst: Path, rng: random.Random) -> str:
    """access_stats.parquet with one cell, drawn by `rng`, made a number no profiler writes (or
    text)."""
    df = pd.read_parquet(src)
    column, row = rng.choice(list(df.columns)), rng.randrange(len(df))
    value = rng.choice(["x", math.nan, -1.0, 0.0, 1e300, -1e9, math.inf, 2.0**40])
    df[column] = df[column].astype(str if isinstance(value, str) or column == "table" else float)
    df.loc[row, column] = str(value) if column == "table" else value
    df.to_parquet(dst)
    return f"{column}[{row}] = {value!r}"


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mutated_file_is_run_or_refused_in_one_line(name, seed, profile, tmp_path, cli):
    rng = random.Random(f"{name}/{seed}")
    prof = profile["prof"]
    for i in range(CASES):
        d = tmp_path / f"case{i}"
        shutil.copytree(prof, d)
        if name.endswith(".parquet"):
            what = _mutate_stats(prof / name, d / name, rng)
        else:
            doc, path = mutated(json.loads((prof / name).read_text()), rng)
            (d / name).write_text(json.dumps(doc))
            what = "/".join(map(str, path))
        command = rng.choice(READERS[name])
        args = _commands(d, prof, profile["plan"], tmp_path)[command]
        code, _, err = cli(*args)
        assert "Traceback" not in err, (name, what, command, err)
        assert code in (0, 1, 2), (name, what, command, code, err)
        if code == 2:
            assert err.count("\n") == 1, (name, what, command, err)
        shutil.rmtree(d)
