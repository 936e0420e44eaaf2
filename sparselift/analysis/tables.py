"""Tables for people: the analysis' frames in ms, MiB and %, with column names that say so.

The analysis keeps seconds, bytes and trace-clock microseconds (what the files hold and the code
computes with); these functions only reshape and format for display, in reports and notebooks.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from sparselift.analysis.findings import Findings, fmt_ms, fmt_pct

PER_RANK_COLUMNS = {
    "step_s": "step (ms)",
    "sparse_compute_s": "sparse compute (ms)",
    "exposed_comm_s": "exposed comm (ms)",
    "dense_compute_s": "dense compute (ms)",
    "idle_s": "idle (ms)",
    "sparse_comm_s": "sparse comm, hidden or not (ms)",
}


def step_parts(findings: Findings) -> pd.DataFrame:
    """Where the slowest rank's step goes: part, ms, % of the step."""
    return pd.DataFrame(
        {
            "part": [p.name for p in findings.parts],
            "ms": [fmt_ms(p.seconds, unit=False) for p in findings.parts],
            "% of step": [fmt_pct(p.share) for p in findings.parts],
        }
    )


def per_rank(summary: pd.DataFrame) -> pd.DataFrame:
    """Per rank, mean over the profiled steps: the step's parts in ms and the rank's imbalance."""
    mean = summary.groupby("rank")[[*PER_RANK_COLUMNS, "imbalance_step"]].mean()
    out = pd.DataFrame({"rank": mean.index.astype(str)})
    for col, label in PER_RANK_COLUMNS.items():
        out[label] = [fmt_ms(v, unit=False) for v in mean[col]]
    out["imbalance (max / mean rank)"] = [f"{v:.2f}" for v in mean["imbalance_step"]]
    return out


def critical_path(cp: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """The critical sparse path stage by stage, mean over the profiled steps.

    Args:
        cp: `summary.critical_path` output.
        steps: measured steps per rank (rank, step, start_us), to place each stage in its step.
    Returns:
        stage, starts (ms into the step), compute, waiting and total (ms), % of the sparse path.
    """
    cols = ["stage", "starts (ms into step)", "compute (ms)", "waiting (ms)", "total (ms)"]
    if cp.empty:
        return pd.DataFrame(columns=[*cols, "% of sparse path"])
    at = cp.merge(
        steps[["rank", "step", "start_us"]].rename(columns={"start_us": "step_start_us"}),
        on=["rank", "step"],
    )
    at["offset_s"] = (at["start_us"] - at["step_start_us"]) * 1e-6
    mean = at.groupby("kind", sort=False)[["offset_s", "compute_s", "wait_s", "total_s"]].mean()
    path_s = float(mean["total_s"].sum())
    out = pd.DataFrame({"stage": mean.index})
    for label, col in zip(cols[1:], ("offset_s", "compute_s", "wait_s", "total_s"), strict=True):
        out[label] = [fmt_ms(v, unit=False) for v in mean[col]]
    out["% of sparse path"] = [fmt_pct(v / path_s if path_s > 0 else 0.0) for v in mean["total_s"]]
    return out


def table_overview(overview: pd.DataFrame) -> pd.DataFrame:
    """`views.table_overview` for reading: counts with thousands separators, shares in %."""
    o = overview
    return pd.DataFrame(
        {
            "table": o["table"],
            "rows": [f"{int(v):,}" for v in o["rows"]],
            "dim": [f"{int(v)}" for v in o["dim"]],
            "ids per step": [f"{v:,.0f}" for v in o["ids_per_step"]],
            "unique ids": [fmt_pct(v) for v in o["unique_ratio"]],
            "pooling mean": [f"{v:.1f}" for v in o["pooling_mean"]],
            "pooling p99": [f"{v:.0f}" for v in o["pooling_p99"]],
            "top 1 % rows' share": [fmt_pct(v) for v in o["top1pct_share"]],
            "top 10 % rows' share": [fmt_pct(v) for v in o["top10pct_share"]],
            "Zipf alpha": [f"{v:.2f}" for v in o["zipf_alpha"]],
        }
    )


def bench(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """`views.bench_rows` for reading: step times in ms, steps/s, speed vs the first plan."""

    def ms(v: float | None) -> str:
        return "–" if v is None else fmt_ms(v, unit=False)

    return pd.DataFrame(
        {
            "plan": [r["plan"] for r in rows],
            "predicted step (ms)": [ms(r["predicted_step_s"]) for r in rows],
            "measured step (ms)": [ms(r["measured_step_s"]) for r in rows],
            "steps/s": [f"{r['steps_per_s']:.1f}" for r in rows],
            "speed vs first plan": [f"{r['ratio']:.2f}x" for r in rows],
        }
    )
