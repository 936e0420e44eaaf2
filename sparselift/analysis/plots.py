"""HoloViews plots of profiles and plans: what users look at before they trust a plan.

Each function takes the stage's own data (DataFrames read from a profile or an analysis output, or
`sparselift.plans.Plan` objects) and returns a HoloViews element; notebooks display them and
`report.py` renders the same ones into a self-contained HTML page. No analysis happens here beyond
reshaping for display.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401 - registers the Bokeh backend that `.opts` needs
import numpy as np
import pandas as pd

from sparselift.analysis.findings import STEP_PARTS as STEP_PARTS_LABELS
from sparselift.analysis.names import SPARSE_STAGES
from sparselift.kernels import zipf_top_share

SIZE = dict(width=720, height=320, tools=["hover"])
# Main-thread parts add up to the step; sparse communication runs beside them (partly hidden).
STEP_PARTS = ("sparse_compute_s", "dense_compute_s", "exposed_comm_s", "idle_s")


# ------------------------------------------------------------------------------------- profiles


def zipf_lorenz(alpha: float, rows: int, points: int = 60) -> pd.DataFrame:
    """Share of lookups that hit the hottest x share of rows, for a Zipf(alpha) law over `rows`."""
    ranks = np.unique(np.geomspace(1, rows, points).astype(np.int64))
    share = [zipf_top_share(rows, alpha, int(k)) for k in ranks]
    return pd.DataFrame({"row_share": ranks / rows, "lookup_share": share})


def access_skew(access: pd.DataFrame) -> hv.Overlay:
    """Per table: share of lookups vs share of rows.

    A curve per table for its fitted Zipf law, and crosses for the measured top-1 % and top-10 %
    shares.
    """
    per_table = access.groupby("table", sort=False).agg(
        rows=("num_embeddings", "first"),
        alpha=("zipf_alpha", "first"),
        top1=("top1pct_share", "mean"),
        top10=("top10pct_share", "mean"),
    )
    curves, points = [], []
    for table, r in per_table.iterrows():
        curve = zipf_lorenz(float(r.alpha), int(r.rows)).assign(table=table)
        curves.append(hv.Curve(curve, "row_share", ["lookup_share", "table"], label=str(table)))
        points.append(
            pd.DataFrame(
                {"row_share": [0.01, 0.10], "lookup_share": [r.top1, r.top10], "table": table}
            )
        )
    measured = hv.Scatter(
        pd.concat(points), "row_share", ["lookup_share", "table"], label="measured"
    ).opts(size=7, color="black", marker="x")
    return hv.Overlay(curves + [measured]).opts(
        title="Access skew: share of lookups vs share of rows (curves: fitted Zipf; x: measured)",
        logx=True,
        xlabel="share of rows (hottest first)",
        ylabel="share of lookups",
        legend_position="right",
        **SIZE,
    )


def pooling_factors(access: pd.DataFrame) -> hv.Overlay:
    """Ids per sample per table: p50, mean, p99 and max over ranks and profiled steps."""
    g = (
        access.groupby("table", sort=False)
        .agg(
            p50=("pooling_p50", "median"),
            mean=("pooling_mean", "mean"),
            p99=("pooling_p99", "max"),
            max=("pooling_max", "max"),
        )
        .reset_index()
    )
    segs = hv.Segments(g, ["table", "p50", "table", "p99"]).opts(color="gray", line_width=3)
    marks = [
        hv.Scatter(g, "table", [k], label=k).opts(size=8) for k in ("p50", "mean", "p99", "max")
    ]
    return (segs * hv.Overlay(marks)).opts(
        title="Pooling factor (ids per sample) per table",
        ylabel="ids per sample",
        logy=True,
        legend_position="right",
        **SIZE,
    )


def step_breakdown(summary: pd.DataFrame) -> hv.Overlay:
    """Per rank, mean over steps: the step's parts stacked, in ms, and all sparse communication
    (hidden or not) as a cross."""
    mean = summary.groupby("rank")[list(STEP_PARTS) + ["sparse_comm_s"]].mean().reset_index()
    mean["rank"] = mean["rank"].astype(str)
    long = mean.melt(
        id_vars="rank", value_vars=list(STEP_PARTS), var_name="part", value_name="seconds"
    )
    long["ms"] = long["seconds"] * 1e3
    long["part"] = long["part"].map(STEP_PARTS_LABELS)
    bars = hv.Bars(long, ["rank", "part"], "ms").opts(stacked=True)
    comm = hv.Scatter(
        mean.assign(ms=mean["sparse_comm_s"] * 1e3),
        "rank",
        "ms",
        label="sparse communication, hidden or not",
    ).opts(size=12, marker="x", color="black")
    return (bars * comm).opts(
        title="Where a step goes, per rank (mean over profiled steps)",
        ylabel="ms",
        legend_position="right",
        **SIZE,
    )


def imbalance(summary: pd.DataFrame, column: str = "step_s") -> hv.Bars:
    """Per step: slowest rank ÷ mean rank of `column` (1.0 = perfectly balanced)."""
    g = summary.groupby("step")[column]
    df = (g.max() / g.mean()).rename("max_over_mean").reset_index()
    df["step"] = df["step"].astype(str)
    return hv.Bars(df, "step", "max_over_mean").opts(
        title=f"Imbalance across ranks ({column}: max / mean)", ylim=(0, None), **SIZE
    )


def timeline(nodes: pd.DataFrame, step: int | None = None) -> hv.Segments:
    """Sparse-path stages per rank over one profiled step (the first by default), a bar per node.

    Times are ms since each rank's first sparse event of the step (ranks' clocks are not aligned).
    """
    df = nodes[nodes["stage"].isin(SPARSE_STAGES)]
    df = df[df["step"] == (df["step"].min() if step is None else step)].copy()
    df["dur_ms"] = df["dur_s"] * 1e3
    t0 = df.groupby("rank")["start_us"].transform("min")  # ranks' clocks are not aligned
    df["start_ms"] = (df["start_us"] - t0) / 1e3
    df["end_ms"] = (df["end_us"] - t0) / 1e3
    df["lane"] = (
        "rank "
        + df["rank"].astype(str)
        + " · "
        + df["stage"].astype(str)
        + " "
        + df["phase"].astype(str)
    )
    return hv.Segments(
        df, ["start_ms", "lane", "end_ms", "lane"], ["stage", "part", "module", "dur_ms"]
    ).opts(
        color="stage",
        cmap="Category10",
        line_width=10,
        title="Timeline of sparse-path stages (one step)",
        xlabel="ms since the rank's first sparse event",
        width=900,
        height=max(240, 26 * df["lane"].nunique()),
        tools=["hover"],
    )


# ---------------------------------------------------------------------------------------- plans


def plan_table_bytes(plan: Any, bytes_per_value: int = 4) -> pd.DataFrame:
    """Bytes of each table's weights on each rank (data-parallel tables are whole on every rank)."""
    rows = []
    dims = {t.name: t for t in plan.sharded_tables()}  # a split table's parts, as sharded
    for t in plan.tables:
        if t.sharding_type == "data_parallel":
            f = dims[t.name]
            rows += [
                (t.name, r, f.num_embeddings * f.embedding_dim * bytes_per_value) for r in t.ranks
            ]
        else:
            rows += [(t.name, s.rank, s.sizes[0] * s.sizes[1] * bytes_per_value) for s in t.shards]
    df = pd.DataFrame(rows, columns=["table", "rank", "bytes"])
    return df.groupby(["table", "rank"], sort=False, as_index=False)["bytes"].sum()


def placement_heatmap(plan: Any, name: str) -> hv.HeatMap:
    """MiB of each table's weights on each rank of one plan (`name` titles it)."""
    df = plan_table_bytes(plan)
    df["MiB"] = df["bytes"] / 2**20
    df["rank"] = df["rank"].astype(str)
    return hv.HeatMap(df, ["rank", "table"], "MiB").opts(
        title=f"{name}: table placement (MiB of weights per rank)",
        colorbar=True,
        cmap="Blues",
        width=420,
        height=max(260, 18 * df["table"].nunique()),
        tools=["hover"],
    )


def sharding_mix(plans: dict[str, Any]) -> hv.Bars:
    """Tables per sharding type, stacked per plan."""
    rows = [(name, t.sharding_type) for name, p in plans.items() for t in p.tables]
    df = (
        pd.DataFrame(rows, columns=["plan", "sharding_type"])
        .value_counts()
        .rename("tables")
        .reset_index()
    )
    return hv.Bars(df, ["plan", "sharding_type"], "tables").opts(
        stacked=True, title="Sharding-type mix", legend_position="right", **SIZE
    )


def per_rank_predicted(plans: dict[str, Any]) -> hv.Layout:
    """Predicted per-rank cost and memory of each plan (from the plan's own `predicted`)."""
    rows = []
    for name, p in plans.items():
        for r in (p.predicted or {}).get("per_rank") or []:
            rows.append(
                dict(
                    plan=name,
                    rank=str(r.get("rank")),
                    cost_ms=1e3 * (r.get("compute_s", 0) + r.get("comm_s", 0)),
                    memory_MiB=r.get("memory_bytes", 0) / 2**20,
                )
            )
    if not rows:  # plans with no prediction (e.g. exported from TorchRec): memory from placement
        for name, p in plans.items():
            b = plan_table_bytes(p).groupby("rank")["bytes"].sum()
            rows += [
                dict(plan=name, rank=str(k), cost_ms=np.nan, memory_MiB=v / 2**20)
                for k, v in b.items()
            ]
    df = pd.DataFrame(rows)
    cost = hv.Bars(df, ["rank", "plan"], "cost_ms").opts(
        title="Predicted cost per rank", ylabel="ms", **SIZE
    )
    mem = hv.Bars(df, ["rank", "plan"], "memory_MiB").opts(
        title="Memory per rank", ylabel="MiB", **SIZE
    )
    return (cost + mem).cols(1)


def predicted_vs_measured(rows: Sequence[dict[str, Any]]) -> hv.Overlay:
    """`rows`: plan, predicted_step_s, measured_step_s — the diagonal is a perfect prediction."""
    df = pd.DataFrame(rows).dropna(subset=["predicted_step_s", "measured_step_s"])
    df["predicted_ms"] = df["predicted_step_s"] * 1e3
    df["measured_ms"] = df["measured_step_s"] * 1e3
    hi = float(max(df["predicted_ms"].max(), df["measured_ms"].max()) * 1.1) if len(df) else 1.0
    diag = hv.Curve([(0, 0), (hi, hi)]).opts(color="gray", line_dash="dashed")
    pts = hv.Scatter(df, "measured_ms", ["predicted_ms", "plan"]).opts(
        size=10, color="plan", cmap="Category10"
    )
    return (diag * pts).opts(
        title="Predicted vs measured step time", xlabel="measured ms", ylabel="predicted ms", **SIZE
    )
