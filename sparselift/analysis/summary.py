"""Per rank and step: where the time went, how unbalanced ranks are, the sparse critical path.

Each part is split in two: what one rank's nodes give (`rank_summary`, `rank_critical`), made
where the rank is analyzed, and what compares ranks (`with_imbalance`, `pick_critical`), made on
those compact rows; `summarize` and `critical_path` are the two together on a whole graph.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sparselift.analysis.edges import STAGE_ORDER
from sparselift.analysis.names import SPARSE_STAGES
from sparselift.analysis.ordered import group_codes, ordered_sums
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
    return with_imbalance(rank_summary(nodes, steps))


def rank_summary(nodes: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """`summarize` without the imbalance columns, which compare ranks: what one rank's nodes give
    (or several ranks', the same rows), so that each rank's is made where it is analyzed.

    Returns:
        SUMMARY_COLUMNS but `imbalance_*`, one row per row of `steps`, in its order.
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
    return out.fillna(0.0).reset_index()[SUMMARY_COLUMNS[:-2]]


def with_imbalance(summary: pd.DataFrame) -> pd.DataFrame:
    """`rank_summary` rows of every rank (in rank order) with `imbalance_step` and
    `imbalance_sparse`: per step, the slowest rank's `step_s` / `sparse_path_s` over the ranks'
    mean (1.0 where the mean is 0).

    Returns:
        A new frame with SUMMARY_COLUMNS, on a fresh index.
    """
    out = summary.reset_index(drop=True)
    codes, n = group_codes(out, ["step"])
    counts = np.bincount(codes, minlength=n).astype(np.float64)
    for col, of in (("imbalance_step", "step_s"), ("imbalance_sparse", "sparse_path_s")):
        values = out[of].to_numpy(dtype=np.float64)
        # the ranks' mean as `Series.mean` adds them, in rank order
        mean = (ordered_sums(values, codes, n) / np.maximum(counts, 1.0))[codes]
        top = out.groupby("step")[of].transform("max").to_numpy(dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[col] = np.where(mean != 0, top / mean, 1.0)
    return out[SUMMARY_COLUMNS]


CRITICAL_COLUMNS = ["step", "rank", "kind", "start_us", "compute_s", "wait_s"]


def critical_path(nodes: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Per step, the slowest rank's sparse path stage by stage.

    Args:
        nodes: graph nodes.
        summary: `summarize` output (picks the slowest rank of each step).
    Returns:
        step, rank, kind (in STAGE_ORDER), start_us (trace clock), compute_s, wait_s (exposed
        communication) and total_s.
    """
    return pick_critical(rank_critical(nodes), summary)


def rank_critical(nodes: pd.DataFrame) -> pd.DataFrame:
    """Every rank's and step's sparse path stage by stage, of which `pick_critical` keeps the
    slowest rank's: what one rank's nodes give, so that it is made where the rank is analyzed.

    Returns:
        CRITICAL_COLUMNS, one row per (rank, step, kind in STAGE_ORDER) that has compute or wait
        nodes, in that order; compute_s and wait_s add up the nodes' durations in node order.
    """
    s = nodes[nodes["part"].isin(("compute", "wait")) & nodes["kind"].isin(STAGE_ORDER)]
    s = s.assign(order=s["kind"].map({k: i for i, k in enumerate(STAGE_ORDER)}))
    codes, n = group_codes(s, ["rank", "step", "order"])
    first = s.groupby(["rank", "step", "order"], sort=True)
    out = first.agg(kind=("kind", "first"), start_us=("start_us", "min")).reset_index()
    dur = s["dur_s"].to_numpy(dtype=np.float64)
    for col, part in (("compute_s", "compute"), ("wait_s", "wait")):
        out[col] = ordered_sums(dur, np.where(s["part"].to_numpy() == part, codes, -1), n)
    return out[CRITICAL_COLUMNS]


def pick_critical(critical: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The rows of `rank_critical` (every rank's, in rank order) of each step's slowest rank (the
    first of the largest `step_s` in `summary`), steps in order, and their total_s.

    Returns:
        CRITICAL_COLUMNS and total_s (compute_s + wait_s).
    """
    top = summary.loc[summary.groupby("step")["step_s"].idxmax(), ["step", "rank"]]
    cp = critical.merge(top, on=["step", "rank"], how="inner", sort=False)
    cp = cp.sort_values("step", kind="stable").reset_index(drop=True)
    if cp.empty:
        cp = pd.DataFrame([], columns=CRITICAL_COLUMNS)
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
