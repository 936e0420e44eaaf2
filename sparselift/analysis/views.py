"""What the notebooks and the HTML reports show, assembled from the package's own functions.

A view is a list of (heading, content) sections — content a HoloViews object, a DataFrame, an
object with `_repr_html_` (e.g. `Findings`) or text — so the same sections render in a notebook
(`show`) and in one HTML file (`report.write_report`). A profile's view opens with its findings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import holoviews as hv
import pandas as pd

from sparselift import plans
from sparselift.analysis import plots, tables
from sparselift.analysis.findings import Findings, key_findings
from sparselift.analysis.pipeline import Analysis, analyze
from sparselift.plans.render import DP, SHORT, collective_types, hot_share

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


def plan_label(path: str | Path) -> str:
    """A plan file's short name in reports: its file name without `.json`."""
    return Path(path).name.removesuffix(".json")


def load_plans(paths: list[str | Path]) -> dict[str, Any]:
    """Plans by a short unique name (`plan_label`; the path if taken).

    Raises:
        PlanError: a file is not a valid plan (`sparselift.plans.load`; bad input, exit 2).
    """
    out = {}
    for p in paths:
        name = plan_label(p)
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
        plan = named_plans.get(plan_label(c["plan"])) if c.get("plan") else None
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


def _ranks(ranks: list[int]) -> str:
    """Ranks for people, runs of consecutive ranks joined ("rank 1", "ranks 0-3, 6")."""
    distinct = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in distinct:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"rank{'s' if len(distinct) > 1 else ''} {text}"


def split_rows(plan: Any) -> list[dict[str, Any]]:
    """The plan's splits, one dict per split model table, in the plan's order.

    Returns:
        table, kind, rows (the model table's), parts (one dict per virtual table: name, extent
        ("2,327 hot rows", "rows 0-20000", "cols 16-32"), sharding (e.g. "TW rank 1")),
        hot_rows and hot_share (hot_cold only, else None; hot_share None where not recorded).
    """
    model = {t.name: t for t in plan.model}
    by_name = {t.name: t for t in plan.tables}
    fps = {t.name: t for t in plan.sharded_tables()}
    out = []
    for s in plan.splits:
        if s.kind == "hot_cold":
            extents = [f"{len(s.hot_ids):,} hot rows", f"{fps[s.parts[1]].num_embeddings:,} rows"]
        else:
            word = "rows" if s.kind == "row_ranges" else "cols"
            extents = [f"{word} {a}-{b}" for a, b in s.ranges]
        parts = []
        for name, extent in zip(s.parts, extents, strict=True):
            t = by_name[name]
            parts.append(
                dict(
                    name=name, extent=extent, sharding=f"{SHORT[t.sharding_type]} {_ranks(t.ranks)}"
                )
            )
        hot = s.kind == "hot_cold"
        out.append(
            dict(
                table=s.table,
                kind=s.kind,
                rows=model[s.table].num_embeddings,
                parts=parts,
                hot_rows=len(s.hot_ids) if hot else None,
                hot_share=hot_share(plan, s.table) if hot else None,
            )
        )
    return out


def splits_table(plan: Any) -> pd.DataFrame:
    """`split_rows` for reading: a row per split table, its parts in one cell, counts with
    thousands separators, the hot share in % ("not recorded" where the plan has none)."""
    rows = split_rows(plan)

    def share(r: dict[str, Any]) -> str:
        if r["kind"] != "hot_cold":
            return "–"
        return "not recorded" if r["hot_share"] is None else f"{r['hot_share']:.1%}"

    return pd.DataFrame(
        {
            "table": [r["table"] for r in rows],
            "kind": [r["kind"] for r in rows],
            "parts (rows or columns, sharding)": [
                "; ".join(f"{p['name']}: {p['extent']}, {p['sharding']}" for p in r["parts"])
                for r in rows
            ],
            "hot rows": ["–" if r["hot_rows"] is None else f"{r['hot_rows']:,}" for r in rows],
            "hot rows' share of the table": [
                "–" if r["hot_rows"] is None else f"{r['hot_rows'] / r['rows']:.2%}" for r in rows
            ],
            "hot share of lookups": [share(r) for r in rows],
        }
    )


def hot_share_plot(named_plans: dict[str, Any]) -> hv.Overlay | None:
    """Per hot/cold split table of each plan: the share of lookups its hot part serves vs its
    hot rows (log scale, from one row to the largest split table's rows, so that a point shows
    how small a part of its table serves that share), a point labelled with the table; None if
    no plan records a share."""
    df = pd.DataFrame(
        [
            dict(
                plan=name,
                table=r["table"],
                hot_rows=r["hot_rows"],
                hot_share=r["hot_share"],
                table_rows=r["rows"],
            )
            for name, p in named_plans.items()
            for r in split_rows(p)
            if r["hot_share"] is not None
        ]
    )
    if df.empty:
        return None
    points = hv.Scatter(df, "hot_rows", ["hot_share", "table", "plan", "table_rows"]).opts(
        size=10, color="plan", cmap="Category10"
    )
    labels = hv.Labels(df, ["hot_rows", "hot_share"], "table").opts(
        yoffset=0.04, text_font_size="9pt"
    )
    return (points * labels).opts(
        title="Hot/cold splits: share of lookups the hot part serves vs its rows",
        logx=True,
        xlim=(1, float(df["table_rows"].max())),  # from one row to the largest split table
        xlabel="hot rows (log; the axis spans the largest split table's rows)",
        ylabel="share of lookups",
        ylim=(0, 1.1),
        **plots.SIZE,
    )


def collectives_table(named_plans: dict[str, Any]) -> pd.DataFrame:
    """Per plan: the all-to-all pairs a step runs (`render.collective_types`, the count `plan
    show` prints), and, where any plan has splits, the count without its splits' parts."""
    split = any(p.splits for p in named_plans.values())
    rows = []
    for name, p in named_plans.items():
        types = collective_types(p)
        row = {
            "plan": name,
            "all-to-all pairs per step": len(types),
            "sharding types": ", ".join(types) or "–",
        }
        if split:
            without = collective_types(p, with_splits=False)
            row["pairs without its splits' parts"] = len(without)
            row["types without them"] = ", ".join(without) or "–"
        row["data-parallel all-reduce"] = (
            "yes" if any(t.sharding_type == DP for t in p.tables) else "no"
        )
        rows.append(row)
    return pd.DataFrame(rows)


def split_sections(named_plans: dict[str, Any]) -> Sections:
    """The splits of the plans that have any (a table each, then the hot-share plot), and the
    collectives per step of every plan."""
    sections: Sections = [
        (f"Splits: {name}", splits_table(p)) for name, p in named_plans.items() if p.splits
    ]
    plot = hot_share_plot(named_plans)
    if plot is not None:
        sections.append(("Splits: hot share of lookups vs hot rows", plot))
    return sections + [("Collectives per step", collectives_table(named_plans))]


def plan_sections(named_plans: dict[str, Any], bench: dict[str, Any] | None = None) -> Sections:
    """Plans side by side: predicted cost and memory, sharding mix, placement, splits (of the
    plans that have any) and collectives per step, bench if given."""
    sections: Sections = [
        ("Per-rank predicted cost and memory", plots.per_rank_predicted(named_plans)),
        ("Sharding-type mix", plots.sharding_mix(named_plans)),
    ]
    sections += [
        (f"Placement: {name}", plots.placement_heatmap(p, name)) for name, p in named_plans.items()
    ]
    sections += split_sections(named_plans)
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
