"""Per rank and step: where the time went, how unbalanced ranks are, the sparse critical path."""

from __future__ import annotations

import pandas as pd

from sparselift.analysis.edges import STAGE_ORDER
from sparselift.analysis.names import SPARSE_STAGES
from sparselift.analysis.reconstruct import MAIN_PARTS

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
    """Where each rank's step went: one row per rank and step, SUMMARY_COLUMNS, in seconds.

    The main-thread parts (sparse_compute_s, dense_compute_s, exposed_comm_s, idle_s) add up to
    `accounted_s`, which is the measured `step_s` up to what lies outside every event. The
    `*_comm_s` columns are collective time, hidden or not; `imbalance_*` is the slowest rank over
    the ranks' mean in that step (1.0: balanced).

    Args:
        nodes: graph nodes (`reconstruct.NODE_COLUMNS`).
        steps: measured steps per rank (rank, step, dur_s).
    """
    sparse = nodes["stage"].isin(SPARSE_STAGES)
    main = nodes["part"].isin(MAIN_PARTS)
    part = nodes["part"]
    masks = {
        "sparse_compute_s": main & sparse & (part == "compute"),
        "sparse_comm_s": sparse & (part == "collective"),
        "dense_compute_s": main & ~sparse & (part == "compute"),
        "dense_comm_s": ~sparse & (part == "collective"),
        "exposed_comm_s": main & (part == "wait"),
        "idle_s": part == "idle",
        "accounted_s": main,
        "sparse_path_s": main & sparse,
    }
    out = (
        steps[["rank", "step", "dur_s"]]
        .rename(columns={"dur_s": "step_s"})
        .set_index(["rank", "step"])
    )
    for col, mask in masks.items():
        out[col] = nodes[mask].groupby(["rank", "step"])["dur_s"].sum()
    out = out.fillna(0.0).reset_index()
    by_step = out.groupby("step")
    for col, of in (("imbalance_step", "step_s"), ("imbalance_sparse", "sparse_path_s")):
        # the slowest rank over the ranks' mean
        out[col] = by_step[of].transform(lambda s: s.max() / s.mean() if s.mean() else 1.0)
    return out[SUMMARY_COLUMNS]


def critical_path(nodes: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per step, the slowest rank's sparse path stage by stage.

    Args:
        nodes: graph nodes.
        summary: `summarize` output (picks the slowest rank of each step).
    Returns:
        step, rank, kind (in STAGE_ORDER), start_us (trace clock), compute_s, wait_s (exposed
        communication) and total_s.
    """
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
    """The printed table: milliseconds per rank and step, then the mean critical path.

    Args:
        summary: `summarize` output.
        cp: `critical_path` output; None or empty: no critical-path line.
    """
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
