"""What the notebooks and the HTML reports show, assembled from the package's own functions.

A view is a list of (heading, content) sections — content a HoloViews object, a DataFrame, an
object with `_repr_html_` (e.g. `Findings`) or text — so the same sections render in a notebook
(`show`) and in one HTML file (`report.write_report`). A profile's view opens with its findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sparselift import plans
from sparselift.analysis import plots, tables
from sparselift.analysis.findings import Findings, key_findings
from sparselift.analysis.pipeline import Analysis, analyze

Sections = list[tuple[str, Any]]


@dataclass
class ProfileView:
    """A profile directory with its analysis, ready to plot.

    Attributes:
        path: the profile directory.
        manifest: its manifest, as the analysis read and checked it.
        access: its access statistics (one row per table, rank and step), if recorded.
        analysis: what `analyze` computed.
    """

    path: Path
    manifest: dict[str, Any]
    access: pd.DataFrame | None
    analysis: Analysis

    @property
    def summary(self) -> pd.DataFrame:
        """Where each rank's step went (`summary.SUMMARY_COLUMNS`, seconds)."""
        return self.analysis.summary

    @property
    def findings(self) -> Findings:
        """Step time, where it goes and the critical sparse stage."""
        a = self.analysis
        return key_findings(a.summary, a.critical_path, a.nodes)


def open_profile(path: str | Path, analysis: Analysis | None = None) -> ProfileView:
    """A profile directory's view.

    Args:
        path: the profile directory.
        analysis: its analysis if already computed; else it is analyzed (traces parse once, then
            come from the cache beside them).
    Raises:
        UserError: the directory is not a complete profile (`analyze`).
    """
    a = analysis if analysis is not None else analyze(path)
    return ProfileView(path=Path(path), manifest=a.manifest, access=a.access_stats, analysis=a)


def table_overview(access: pd.DataFrame) -> pd.DataFrame:
    """Per table, over ranks and profiled steps: ids per step, unique ratio, pooling, skew.

    Returns:
        table, rows, dim, ids_per_step, unique_ratio, pooling_mean, pooling_p99, top1pct_share,
        top10pct_share, zipf_alpha (numbers; `tables.table_overview` formats them).
    """
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


def run_line(manifest: dict[str, Any]) -> str:
    """One line on what was profiled: workload, ranks, device, batch, pipeline, steps."""
    m = manifest
    return (
        f"workload {m.get('workload')}, {m.get('world_size')} ranks "
        f"({m.get('device')}/{m.get('backend')}), batch {m.get('batch_size')}/rank, "
        f"pipeline {m.get('pipeline')}, profiled steps {m.get('profiled_steps')}"
    )


def profile_sections(view: ProfileView) -> Sections:
    """A profile's report: findings first, then the run, tables, plots and summary tables."""
    a = view.analysis
    findings = view.findings
    sections: Sections = [
        ("Findings", findings),
        (
            "Where the step goes (slowest rank, mean over profiled steps)",
            tables.step_parts(findings),
        ),
        ("Critical sparse path (slowest rank, mean over profiled steps)", _critical(a)),
        ("Run", run_line(view.manifest)),
    ]
    if view.access is not None and not view.access.empty:
        sections += [
            ("Tables", tables.table_overview(table_overview(view.access))),
            ("Access skew", plots.access_skew(view.access)),
            ("Pooling factors", plots.pooling_factors(view.access)),
        ]
    return sections + [
        ("Step breakdown per rank", plots.step_breakdown(view.summary)),
        ("Timeline of the sparse path", plots.timeline(a.nodes)),
        ("Imbalance across ranks", plots.imbalance(view.summary)),
        ("Per rank (mean over profiled steps)", tables.per_rank(view.summary)),
    ]


def _critical(a: Analysis) -> pd.DataFrame:
    return tables.critical_path(a.critical_path, a.steps)


def load_plans(paths: list[str | Path]) -> dict[str, Any]:
    """Plans by a short unique name (the file name without `.json`; the path if taken).

    Raises:
        PlanError: a file is not a valid plan (`sparselift.plans.load`; bad input, exit 2).
    """
    out = {}
    for p in paths:
        name = Path(p).name.removesuffix(".json")
        out[name if name not in out else str(p)] = plans.load(p)
    return out


def bench_rows(bench: dict[str, Any] | None, named_plans: dict[str, Any]) -> list[dict[str, Any]]:
    """Predicted (from each plan) vs measured step times of a `sparselift bench --json` result.

    Args:
        bench: the bench result, or None (no rows).
        named_plans: `load_plans` output; a contender's plan is found by its file name.
    Returns:
        One dict per contender: plan (label), predicted_step_s (None when its plan is not given
        or predicts nothing), measured_step_s, steps_per_s, ratio (speed vs the first contender).
    """
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
    """Plans side by side: predicted cost and memory, sharding mix, placement, bench if given."""
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
        sections.append(("Bench", tables.bench(rows)))
    return sections


def show(sections: Sections) -> None:
    """Display sections in a notebook, in order."""
    from IPython.display import Markdown, display

    for heading, content in sections:
        display(Markdown(f"### {heading}"))
        display(content)
