"""Notebooks run clean headless against a real profile and plans; HTML reports render offline."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest
from browser import render
from conftest import ROOT
from nbclient import NotebookClient

# Each test runs `sparselift` in subprocesses, a Jupyter kernel or a headless browser.
pytestmark = pytest.mark.slow


def sparselift(*args) -> None:
    subprocess.run(
        [sys.executable, "-m", "sparselift.cli", *map(str, args)],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A real 2-rank profile of `tiny`, and two plans for it."""
    d = tmp_path_factory.mktemp("tiny")
    sparselift(
        "profile",
        "--workload",
        "tiny",
        "--nproc",
        2,
        "--steps",
        2,
        "--warmup",
        1,
        "--out",
        d / "profile",
    )
    sparselift(
        "plan",
        "from-torchrec",
        "--workload",
        "tiny",
        "--world-size",
        2,
        "--out",
        d / "torchrec.plan.json",
    )
    sparselift(
        "plan",
        "round-robin",
        "--workload",
        "tiny",
        "--world-size",
        2,
        "--out",
        d / "round-robin.plan.json",
    )
    return d


def run_notebook(name: str, params: str) -> nbformat.NotebookNode:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{name} must have exactly one parameters cell"
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{name} is committed with outputs"
    )
    cells[0].source = params
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
    ).execute()
    return nb


def _outputs(nb) -> list[str]:
    return [
        json.dumps(o.get("data", {})) for c in nb.cells if c.cell_type == "code" for o in c.outputs
    ]


def test_profile_tour_runs_clean(tiny_run):
    nb = run_notebook("profile_tour.ipynb", f"PROFILE = {str(tiny_run / 'profile')!r}")
    outs = _outputs(nb)
    assert sum("application/vnd.holoviews_exec.v0+json" in o or "bokeh" in o for o in outs) >= 5
    assert any("t7" in o for o in outs)  # the table overview lists the tables


def test_plan_compare_runs_clean(tiny_run):
    plans = [str(tiny_run / "torchrec.plan.json"), str(tiny_run / "round-robin.plan.json")]
    nb = run_notebook("plan_compare.ipynb", f"PLANS = {plans!r}\nBENCH = None")
    assert any("round-robin" in o for o in _outputs(nb))


def test_analyze_html_report_renders_offline(tiny_run, cli):
    out = tiny_run / "report.html"
    code, _, err = cli(
        "analyze", tiny_run / "profile", "--out", tiny_run / "analysis", "--html", out
    )
    assert code == 0, err
    page = render(out)
    assert page.errors == [] and page.requests == []  # nothing fetched: Bokeh is inline
    assert page.canvases >= 5
    # the report opens with its findings: step time, where it goes, the critical stage
    text = page.text
    first = {k: text.find(k) for k in ("Step time", "Where it goes", "Critical sparse stage")}
    assert all(i >= 0 for i in first.values()), text[:2000]
    assert " ms" in text and " MiB" in text and " %" in text
    headings = ("Run", "Tables", "Access skew", "Step breakdown per rank")
    later = [text.find(f"\n{k}\n") for k in headings]
    assert all(i > max(first.values()) for i in later), text[:2000]
    assert "e+12" not in text and "start_us" not in text  # no raw trace-clock timestamps


def test_plan_diff_html_report_renders_offline(tiny_run, cli):
    out = tiny_run / "diff.html"
    code, _, err = cli(
        "plan",
        "diff",
        tiny_run / "torchrec.plan.json",
        tiny_run / "round-robin.plan.json",
        "--html",
        out,
    )
    assert code == 0, err
    page = render(out)
    assert page.errors == [] and page.requests == [] and page.canvases >= 3
