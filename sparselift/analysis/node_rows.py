"""A step's main-thread self-time segments and collectives → node rows, merged per label.

Each segment gets the sparse stage of its innermost event's call stack, or `dense`, or `idle`; a
segment where the thread sits in a wait while a collective is in flight is exposed communication
of that collective's stage (`main_rows`). Nodes of the same label in a step are then merged
(`merge_same`), and sparse nodes whose stack named no module are given the step's (`fill_modules`).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis import names


def kind_of(stage: str | None, phase: str) -> str:
    """Contract op kinds: input_dist, lookup_fwd/bwd, output_dist_fwd/bwd, dense_<phase>."""
    if stage == "input_dist":
        return "input_dist"
    if stage in ("lookup", "output_dist"):
        return f"{stage}_{'bwd' if phase == 'bwd' else 'fwd'}"
    return f"dense_{phase}"


def none_of(v: Any) -> Any:
    """pandas NaN/NA → None, so labels compare and group cleanly."""
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v


# what names a node (its rank and step, what it does and where): the graph's columns before times
NODE_LABELS = [
    "rank",
    "step",
    "kind",
    "stage",
    "phase",
    "module",
    "sharding",
    "part",
    "resource",
    "thread",
]


def merge_same(nodes: pd.DataFrame) -> pd.DataFrame:
    """One main-thread node per (step, kind, module, sharding, part); collectives stay one each.

    A merged node spans its pieces' first start to last end and sums their durations, ids and
    bytes.
    """
    coll = nodes[nodes["part"] == "collective"]
    m = nodes[nodes["part"] != "collective"]
    g = (
        m.groupby(NODE_LABELS, dropna=False, sort=False)
        .agg(
            start_us=("start_us", "min"),
            end_us=("end_us", "max"),
            dur_s=("dur_s", "sum"),
            ids=("ids", "sum"),
            bytes=("bytes", "sum"),
        )
        .reset_index()
    )
    g["coll_key"], g["coll_op"] = None, None
    return pd.concat([g, coll], ignore_index=True)


def fill_modules(nodes: pd.DataFrame) -> pd.DataFrame:
    """Give sparse nodes whose stack named no module (input-dist awaitables) one, in place.

    They take the step's only module, and its input_dist's only sharding type, when there is one;
    else `*` (they serve every module or sharding type). Returns `nodes`.
    """
    sparse = nodes["stage"].isin(names.SPARSE_STAGES)
    for (step,), g in nodes[sparse].groupby(["step"]):
        known = g[g["module"].notna()]
        mods = known["module"].unique()
        shs = known[known["stage"] == "input_dist"]["sharding"].dropna().unique()
        if len(mods) == 0:
            continue
        miss = sparse & (nodes["step"] == step) & nodes["module"].isna()
        nodes.loc[miss, "module"] = mods[0] if len(mods) == 1 else "*"
        miss_sh = sparse & (nodes["step"] == step) & nodes["sharding"].isna()
        nodes.loc[miss_sh, "sharding"] = shs[0] if len(shs) == 1 else "*"
    return nodes


def main_rows(
    labels: list[tuple[Any, ...]],
    segs: pd.DataFrame,
    coll: pd.DataFrame,
    rank: int,
    step: int,
    thread: str,
    cuda: bool = False,
    own: dict[Any, tuple[bool, tuple[Any, ...]]] | None = None,
) -> list[dict[str, Any]]:
    """Label each self-time segment, split at collective boundaries, then sum per label.

    `labels[i]` is main-thread event i's (name, cat, stage, phase, module, sharding); `own`
    keeps what each distinct label implies (`_own_key`) from one step to the next (the same
    dict for every step of a rank's labels).

    On CPU (gloo) the Python thread blocks inside annotations and c10d ops while a collective runs;
    on CUDA it runs ahead of the device and only waits in explicit waits / synchronizations.
    """
    cuts = (
        np.unique(np.concatenate([coll["ts"].values, coll["end"].values])).tolist()
        if len(coll)
        else []
    )
    acc: dict[tuple[Any, ...], dict[str, float]] = {}
    cstart, cend = coll["ts"].tolist(), coll["end"].tolist()
    wait_keys = [
        (c_kind, c_stage or "dense", c_phase, c_mod, c_sh, "wait", "network")
        for c_kind, c_stage, c_phase, c_mod, c_sh in zip(
            *(coll[c].tolist() for c in ("kind", "stage", "phase", "module", "sharding")),
            strict=True,
        )
    ]
    flying_k = range(len(cstart))
    own = {} if own is None else own  # label → (waitable, its own key)
    for a, b, i in zip(segs["start"], segs["end"], segs["event"], strict=True):
        bounds = [a, *cuts[bisect.bisect_right(cuts, a) : bisect.bisect_left(cuts, b)], b]
        label = labels[i] if i >= 0 else None
        if label not in own:
            own[label] = _own_key(label, cuda)
        waitable, own_key = own[label]
        for x, y in zip(bounds, bounds[1:], strict=False):
            key = own_key
            if waitable:  # the first collective in flight at the piece's middle, if any
                mid = (x + y) / 2
                k = next((k for k in flying_k if cstart[k] <= mid and cend[k] > mid), -1)
                if k >= 0:
                    key = wait_keys[k]
            r = acc.setdefault(key, dict(start_us=x, end_us=y, dur_s=0.0))
            r["start_us"], r["end_us"] = min(r["start_us"], x), max(r["end_us"], y)
            r["dur_s"] += (y - x) * 1e-6
    rows = []
    for (kind, stage, phase, mod, sh, part, res), r in acc.items():
        rows.append(
            dict(
                rank=rank,
                step=step,
                kind=kind,
                stage=stage,
                phase=phase,
                module=mod,
                sharding=sh,
                part=part,
                resource=res,
                thread=thread,
                ids=0,
                bytes=0,
                coll_key=None,
                coll_op=None,
                **r,
            )
        )
    return rows


def _own_key(label: tuple[Any, ...] | None, cuda: bool) -> tuple[bool, tuple[Any, ...]]:
    """Whether a segment of the event labelled `label` (None: no event) waits while a
    collective is in flight, and the node key of its time when none is."""
    if label is None:
        return not cuda, ("idle", "idle", "other", None, None, "idle", "idle")
    name, cat, *context = label
    stage, phase, mod, sh = (none_of(v) for v in context)
    waitable = bool(names.WAIT.search(name)) or (
        not cuda and (cat == "user_annotation" or bool(names.C10D.search(name)))
    )
    if stage is not None:
        res = "compute" if stage == "lookup" else "memory"
        return waitable, (kind_of(stage, phase), stage, phase, mod, sh, "compute", res)
    return waitable, (kind_of(None, phase), "dense", phase, None, None, "compute", "compute")
