"""Collectives as executed (gloo worker threads, NCCL kernels), tied to what launched them.

Each executed collective is paired with the main-thread op that launched it (CUDA: through the
runtime call's correlation id; gloo: the next c10d launch of the same op, in order), which gives
it its sparse stage and its tensor size; across ranks, the k-th collective of a step on every rank
is the same call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.stack import MainThread
from sparselift.analysis.trace import Trace, dims_of

# gloo has no reduce-scatter: c10d runs it as an all-reduce
GLOO_RUNS_AS = {"all_reduce": ("reduce_scatter",)}


@dataclass
class LaunchedCollectives:
    """A rank's executed collectives and what could not be tied to a launch.

    Attributes:
        events: the collectives' trace events plus `op` (canonical name), `launch` (index of the
            launching main-thread event, -1: not found) and `bytes` (first tensor's size).
        unplaced: one line per collective name whose launch was not found.
    """

    events: pd.DataFrame
    unplaced: list[str] = field(default_factory=list)


def launched_collectives(tr: Trace, main: pd.DataFrame, thread: MainThread) -> LaunchedCollectives:
    """The collectives of one rank's trace, each with the main-thread op that launched it.

    Args:
        tr: the rank's trace.
        main: its main-thread events, annotated (`stack.annotate_stack`).
        thread: the main thread (its own events are not collectives as executed).
    """
    ev = tr.events
    is_coll = ev["name"].map(lambda n: bool(names.COLLECTIVE.search(n)))
    on_main = (ev["pid"] == thread.pid) & (ev["tid"] == thread.tid)
    coll = ev[is_coll & ~on_main].copy()
    coll["op"] = coll["name"].map(names.collective_op)
    coll = coll[coll["op"] != "barrier"]
    launch = np.full(len(coll), -1)
    if tr.is_cuda:
        rt = ev[(ev["cat"] == "cuda_runtime") & ev["correlation"].notna()]
        corr_ts = dict(zip(rt["correlation"].astype(int), rt["ts"], strict=True))
        for k, c in enumerate(coll["correlation"]):
            if c is not pd.NA and int(c) in corr_ts:
                launch[k] = _enclosing(main, corr_ts[int(c)])
    else:
        c10d = main[main["name"].str.match(names.C10D.pattern)]
        c10d_ops = [
            (i, ts, names.collective_op(n))
            for i, ts, n in zip(c10d.index, c10d["ts"], c10d["name"], strict=True)
        ]
        used: set[int] = set()
        for k, (ts, op) in enumerate(zip(coll["ts"], coll["op"], strict=True)):
            cands = [
                i for i, lts, lop in c10d_ops if i not in used and lop == op and lts <= ts + 1.0
            ]
            if not cands:  # gloo runs some collectives as others (reduce_scatter → all_reduce)
                cands = [
                    i
                    for i, lts, lop in c10d_ops
                    if i not in used and lts <= ts + 1.0 and lop in GLOO_RUNS_AS.get(op, ())
                ]
            if cands:
                launch[k] = cands[0]  # launches run in order on their worker threads
                used.add(cands[0])
    coll["launch"] = launch
    unplaced = [
        f"collective {n!r}: launching op not found"
        for n in coll.loc[coll["launch"] < 0, "name"].unique()
    ]
    sizes = []
    for dims, types, li in zip(
        coll["input_dims"], coll["input_types"], coll["launch"], strict=True
    ):
        if not dims and li >= 0:
            dims, types = main.at[li, "input_dims"], main.at[li, "input_types"]
        sizes.append(_first_tensor_bytes(dims, types))
    coll["bytes"] = sizes
    return LaunchedCollectives(coll, unplaced)


def _enclosing(main: pd.DataFrame, ts: float) -> int:
    """Index of the innermost main-thread event containing ts (-1: none)."""
    hit = main[(main["ts"] <= ts) & (main["end"] >= ts) & (main["cat"] != "cuda_runtime")]
    comm = hit[hit["name"].str.match(names.C10D.pattern)]  # the c10d op carries the shapes
    hit = comm if len(comm) else hit
    return int(hit["depth"].idxmax()) if len(hit) else -1


def _first_tensor_bytes(dims: str, types: str) -> int:
    """Bytes of the first tensor in recorded `Input Dims` / `Input type` (0: none recorded)."""
    d, t = dims_of(dims), dims_of(types)
    for k, x in enumerate(d):
        while isinstance(x, list) and x and isinstance(x[0], list):
            x = x[0]  # TensorList: its first tensor
        if isinstance(x, list) and x:
            elt = names.DTYPE_BYTES.get(t[k] if k < len(t) else "float", 4)
            return int(np.prod(x)) * elt
    return 0


def pair_collectives(nodes: pd.DataFrame) -> list[str]:
    """Pair each rank's k-th collective of a step with the other ranks'; fill transfer and skew.

    A collective ends together on every rank, so the rank that arrived last waited least: the
    smallest duration across ranks is the transfer itself, the rest of each rank's time is skew.
    Computed on the collective nodes' columns at once (the call key groups them), so that it
    costs little however many ranks are merged.

    Args:
        nodes: every rank's nodes; `transfer_s` and `skew_s` are set in place (NaN on nodes that
            are not collectives).
    Returns:
        One line per collective not seen on every rank, or whose op the ranks disagree on, in
        call-key order.
    """
    coll = nodes["part"] == "collective"
    nodes["transfer_s"] = np.nan
    nodes["skew_s"] = np.nan
    c = nodes.loc[coll, ["coll_key", "rank", "coll_op", "dur_s"]]
    if c.empty:
        return []
    by_key = c.groupby("coll_key", sort=True)
    t = by_key["dur_s"].transform("min")
    nodes.loc[coll, "transfer_s"] = t
    nodes.loc[coll, "skew_s"] = c["dur_s"] - t
    world = nodes["rank"].nunique()
    ranks, ops = by_key["rank"].nunique(), by_key["coll_op"].nunique(dropna=False)
    problems = []
    where = by_key.indices
    for key in ranks.index[(ranks != world) | (ops > 1)]:
        g = c.iloc[where[key]]
        names_ = g["coll_op"].unique()
        if ranks[key] != world:
            problems.append(
                f"collective {key} ({', '.join(names_)}) seen on ranks "
                f"{sorted(g['rank'].unique())} only"
            )
        else:
            problems.append(f"collective {key}: ranks disagree on the op ({', '.join(names_)})")
    return problems
