"""What the notebooks and the HTML reports show, assembled from the package's own functions.

A view is a list of (heading, content) sections — content a HoloViews object, a DataFrame or text —
so the same sections render in a notebook (`show`) and in one HTML file (`report.write_report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sparselift.analysis import plots

Sections = list[tuple[str, Any]]


@dataclass
class ProfileView:
    """A profile directory with its analysis, ready to plot."""

    path: Path
    manifest: dict[str, Any]
    access: pd.DataFrame
    analysis: Any  # sparselift.analysis.pipeline.Analysis

    @property
    def summary(self) -> pd.DataFrame:
        return self.analysis.summary


def open_profile(path: str | Path, analysis: Any = None) -> ProfileView:
    """Analyze a profile directory unless given its analysis (traces parse once, cached); the
    manifest and access statistics are the ones the analysis read and checked."""
    from sparselift.analysis.pipeline import analyze

    a = analysis if analysis is not None else analyze(path)
    return ProfileView(path=Path(path), manifest=a.manifest, access=a.access_stats, analysis=a)


def table_overview(access: pd.DataFrame) -> pd.DataFrame:
    """Per table, over ranks and profiled steps: ids per step, unique ratio, pooling, skew."""
    g = access.groupby("table", sort=False)
    out = pd.DataFrame(
        {
            "rows": g["num_embeddings"].first(),
            "dim": g["embedding_dim"].first(),
            "ids_per_step": g["ids"].mean(),
            "unique_ratio": g["unique_ids"].sum() / g["ids"].sum(),
            "pooling_mean": g["pooling_mean"].mean(),
            "pooling_p99": g["pooling_p99"].max(),
            "top1pct_share": g["top1pct_share"].mean(),
            "top10pct_share": g["top10pct_share"].mean(),
            "zipf_alpha": g["zipf_alpha"].first(),
        }
    )
    return out.reset_index()


def profile_sections(view: ProfileView) -> Sections:
    m = view.manifest
    s = view.summary
    per_rank = (
        s.groupby("rank")[
            [
                "step_s",
                "sparse_compute_s",
                "sparse_comm_s",
                "dense_compute_s",
                "exposed_comm_s",
                "idle_s",
            ]
        ]
        .mean()
        .reset_index()
    )
    return [
        (
            "Run",
            f"workload {m['workload']}, {m['world_size']} ranks ({m['device']}/{m['backend']}), "
            f"batch {m['batch_size']}/rank, pipeline {m['pipeline']}, profiled steps {m['profiled_steps']}",
        ),
        ("Tables", table_overview(view.access)),
        ("Access skew", plots.access_skew(view.access)),
        ("Pooling factors", plots.pooling_factors(view.access)),
        ("Step breakdown per rank", plots.step_breakdown(s)),
        ("Timeline of the sparse path", plots.timeline(view.analysis.nodes)),
        ("Imbalance across ranks", plots.imbalance(s)),
        ("Summary per rank (mean over profiled steps, seconds)", per_rank),
        ("Critical sparse path", view.analysis.critical_path),
    ]


def load_plans(paths: list[str | Path]) -> dict[str, Any]:
    """Plans by a short unique name (the file name without `.json`)."""
    from sparselift import plans

    out = {}
    for p in paths:
        name = Path(p).name.removesuffix(".json")
        out[name if name not in out else str(p)] = plans.load(p)
    return out


def bench_rows(bench: dict[str, Any] | None, named_plans: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted (from each plan) vs measured (a `sparselift bench --json` result) step times."""
    rows = []
    for c in (bench or {}).get("contenders", []):
        plan = (
            named_plans.get(Path(c["plan"]).name.removesuffix(".json")) if c.get("plan") else None
        )
        predicted = (plan.predicted or {}).get("step_time_s") if plan is not None else None
        rows.append(
            dict(
                plan=c["label"],
                predicted_step_s=predicted,
                measured_step_s=1.0 / c["median"],
                steps_per_s=c["median"],
                ratio=c["ratio"],
            )
        )
    return rows


def plan_sections(named_plans: dict[str, Any], bench: dict[str, Any] | None = None) -> Sections:
    sections: Sections = [
        ("Per-rank predicted cost and memory", plots.per_rank_predicted(named_plans)),
        ("Sharding-type mix", plots.sharding_mix(named_plans)),
    ]
    sections += [
        (f"Placement: {name}", plots.placement_heatmap(p, name)) for name, p in named_plans.items()
    ]
    rows = bench_rows(bench, named_plans)
    if any(r["predicted_step_s"] and r["measured_step_s"] for r in rows):
        sections.append(("Predicted vs measured step time", plots.predicted_vs_measured(rows)))
    if rows:
        sections.append(("Bench", pd.DataFrame(rows)))
    return sections


def show(sections: Sections) -> None:
    """Display sections in a notebook, in order."""
    from IPython.display import Markdown, display

    for heading, content in sections:
        display(Markdown(f"### {heading}"))
        display(content)
