"""`sparselift tune --html REPORT`: the loop's iterations, its verdict and the plans it compared.

The first section is the verdict (what was shipped and why), then what each iteration predicted
and measured (the model's error on the plans it chose), the joint calibration's leave-one-out
checks, the A/B rounds, and the two plans side by side (`analysis.views.plan_sections`: with
the candidate's splits, when it has any, and each plan's collectives per step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from sparselift.tune import TuneResult


def iteration_table(result: TuneResult) -> pd.DataFrame:
    """One row per profiled plan: predicted and measured step (ms), the baseline's beside it,
    the measured step at the speed of the job the prediction was made in (`levelled_step_s`),
    the prediction's error against that, and a split plan's transform and recombination a
    step."""
    rows = []
    for i, it in enumerate(result.iterations):
        pred, levelled, costs = it.predicted_step_s, it.levelled_step_s, it.split_costs_s
        rows.append(
            {
                "iteration": i,
                "plan": Path(it.plan).name,
                "predicted ms": None if pred is None else round(pred * 1e3, 3),
                "measured ms": round(it.measured_step_s * 1e3, 3),
                "baseline beside ms": round(it.baseline_step_s * 1e3, 3),
                "levelled ms": None if levelled is None else round(levelled * 1e3, 3),
                "error": None
                if pred is None or levelled is None
                else f"{pred / levelled - 1:+.1%}",
                "transform ms": None if costs is None else round(costs[0] * 1e3, 3),
                "recombination ms": None if costs is None else round(costs[1] * 1e3, 3),
                "next plan": Path(it.next_plan).name,
            }
        )
    return pd.DataFrame(rows)


def held_out_table(result: TuneResult) -> pd.DataFrame:
    """The last iteration's leave-one-out checks: each profile predicted by the others' fit."""
    held = result.iterations[-1].held_out if result.iterations else []
    return pd.DataFrame(
        [
            {
                "profile left out": Path(h["profile"]).name,
                "predicted ms": round(h["predicted_step_s"] * 1e3, 3),
                "measured ms": round(h["measured_step_s"] * 1e3, 3),
                "error": f"{h['error']:+.1%}",
                "ran what no other profile ran": ", ".join(h.get("unmeasured", [])),
            }
            for h in held
        ]
    )


def tune_sections(result: TuneResult, work: str | Path) -> list[tuple[str, Any]]:
    """The report's sections, in order (see the module docstring).

    Args:
        result: what `tune` returned.
        work: its work directory (bench.json, when an A/B ran).
    Raises:
        PlanError: a plan file of the loop is not a valid plan.
    """
    from sparselift.analysis.views import load_plans, plan_sections

    sections: list[tuple[str, Any]] = [
        ("Verdict", f"shipped the {result.shipped}: {result.reason}"),
        ("Iterations: predicted vs measured step", iteration_table(result)),
    ]
    held = held_out_table(result)
    if not held.empty:
        sections.append(("Joint calibration: leave-one-out", held))
    if result.ab_ratios:
        rounds = pd.DataFrame(
            {"round": range(1, len(result.ab_ratios) + 1), "candidate ÷ baseline": result.ab_ratios}
        )
        sections.append(
            (
                f"A/B: median {result.ratio:.3f}x, {result.confidence or 0:.1%} interval "
                f"{result.low:.3f}-{result.high:.3f}, {len(result.ab_ratios)} rounds in "
                f"{result.ab_jobs} job{'s' if result.ab_jobs > 1 else ''}",
                rounds,
            )
        )
    bench_file = Path(work, "bench.json")
    bench = json.loads(bench_file.read_text()) if bench_file.is_file() else None
    paths: list[str | Path] = [result.baseline]
    if result.candidate != result.baseline:
        paths.append(result.candidate)
    sections += plan_sections(load_plans(paths), bench)
    return sections


def write_tune_report(path: str | Path, result: TuneResult, work: str | Path) -> None:
    """Write the report to `path` atomically (one self-contained HTML file)."""
    from sparselift.analysis.report import write_report

    write_report(path, "SparseLift tune", tune_sections(result, work))
