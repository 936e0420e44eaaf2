"""Per rank and step: where the time went, how unbalanced ranks are, and the sparse critical path."""

from __future__ import annotations

import pandas as pd

from sparselift.analysis.names import SPARSE_STAGES as SPARSE
from sparselift.analysis.reconstruct import MAIN_PARTS, STAGE_ORDER

SUMMARY_COLUMNS = [
    "rank",
    "step",
    "step_s",
    "accounted_s",
    "sparse_compute_s",
    "sparse_comm_s",
    "dense_compute_s",
    "dense_comm_s",
    "exposed_comm_s",
    "idle_s",
    "sparse_path_s",
    "imbalance_step",
    "imbalance_sparse",
]


def summarize(nodes: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per rank and step; main-thread parts add up to `accounted_s` (≈ the measured step_s)."""
    n = nodes
    sparse = n["stage"].isin(SPARSE)
    main = n["part"].isin(MAIN_PARTS)
    parts = {
        "sparse_compute_s": main & sparse & (n["part"] == "compute"),
        "sparse_comm_s": sparse & (n["part"] == "collective"),
        "dense_compute_s": main & ~sparse & (n["part"] == "compute"),
        "dense_comm_s": ~sparse & (n["part"] == "collective"),
        "exposed_comm_s": main & (n["part"] == "wait"),
        "idle_s": n["part"] == "idle",
        "accounted_s": main,
        "sparse_path_s": main & sparse,
    }
    out = (
        steps[["rank", "step", "dur_s"]]
        .rename(columns={"dur_s": "step_s"})
        .set_index(["rank", "step"])
    )
    for col, mask in parts.items():
        out[col] = n[mask].groupby(["rank", "step"])["dur_s"].sum()
    out = out.fillna(0.0).reset_index()
    g = out.groupby("step")
    for col, of in (
        ("imbalance_step", "step_s"),
        ("imbalance_sparse", "sparse_path_s"),
    ):  # max ÷ mean rank
        out[col] = g[of].transform(lambda s: s.max() / s.mean() if s.mean() else 1.0)
    return out[SUMMARY_COLUMNS]


def critical_path(nodes: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per step, the slowest rank's sparse path stage by stage (compute and exposed wait)."""
    rows = []
    for step, g in summary.groupby("step"):
        rank = int(g.loc[g["step_s"].idxmax(), "rank"])
        s = nodes[
            (nodes["rank"] == rank)
            & (nodes["step"] == step)
            & nodes["part"].isin(("compute", "wait"))
            & nodes["kind"].isin(STAGE_ORDER)
        ]
        for kind in STAGE_ORDER:
            k = s[s["kind"] == kind]
            if len(k):
                rows.append(
                    dict(
                        step=step,
                        rank=rank,
                        kind=kind,
                        start_us=k["start_us"].min(),
                        compute_s=k[k["part"] == "compute"]["dur_s"].sum(),
                        wait_s=k[k["part"] == "wait"]["dur_s"].sum(),
                    )
                )
    cp = pd.DataFrame(rows, columns=["step", "rank", "kind", "start_us", "compute_s", "wait_s"])
    cp["total_s"] = cp["compute_s"] + cp["wait_s"]
    return cp


def format_summary(summary: pd.DataFrame, cp: pd.DataFrame | None = None) -> str:
    """The printed table: milliseconds per rank and step, then the mean critical path."""
    cols = [
        "step_s",
        "sparse_compute_s",
        "sparse_comm_s",
        "dense_compute_s",
        "exposed_comm_s",
        "idle_s",
    ]
    hdr = f"{'rank':>4} {'step':>5} " + " ".join(f"{c[:-2]:>15}" for c in cols) + f" {'imbal':>6}"
    lines = [hdr + "   (ms)"]
    for r in summary.itertuples():
        vals = " ".join(f"{getattr(r, c) * 1e3:15.2f}" for c in cols)
        lines.append(f"{r.rank:>4} {r.step:>5} {vals} {r.imbalance_step:6.2f}")
    if cp is not None and len(cp):
        lines.append(
            "critical sparse path (slowest rank, mean over steps, ms): "
            + ", ".join(
                f"{k} {v * 1e3:.2f}"
                for k, v in cp.groupby("kind", sort=False)["total_s"].mean().items()
            )
        )
    return "\n".join(lines)
