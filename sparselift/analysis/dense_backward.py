"""The backward of data-parallel tables (lookup, gradient all-reduce, optimizer pass), measured
and priced as the optimizer prices it.

TorchRec looks data-parallel tables up with FBGEMM's dense TBE: its backward computes the
tables' gradient, which DDP all-reduces and the trainer's dense optimizer applies. The fused
kernels of the other sharding types also apply row-wise Adagrad in their backward. Per unit of
work the two differ, so lookup_bwd's line is fitted on the fused groups' calls, and the dense
groups' calls measure their own multiple of it (`OpFit.dense_scale`), which the optimizer
prices data-parallel tables' backward work with (`Coefficients.dense_bwd_scale`).

The optimizer also prices those tables' gradient all-reduce (one call more, and a ring over
their weights, at `dp_allreduce`'s fixed and per-byte costs, `dp_allreduce_fit`) and the
trainer's dense optimizer pass over their weights (per element, `dense_grad_b_s`). A profile's
step holds what both cost, so the modelled sparse path of a profile counts them as the
optimizer does (`tables_allreduce_s`, `tables_optimizer_s`). Otherwise the dense residual would
hold them, and every plan would pay them once more.

The optimizer pass is measured where profiles of one model replicate different data-parallel
weights (`dense_optimizer_fit`): the dense work outside forward and backward (the optimizer
step, zero_grad) grows with them. The dense module's own parameters are the same in every
profile, so the slope is the replicated tables' price, whatever the trainer's optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.job_levels import job_of
from sparselift.calibration import (
    DENSE_KERNEL_TYPE,
    DENSE_OPTIMIZER,
    DENSE_OPTIMIZER_UNIT,
    UNITS,
    OpFit,
)
from sparselift.kernels import ring_allreduce_bytes
from sparselift.plans.types import WEIGHT_BYTES

# how far apart the all-reduces' sizes must be to tell their fixed cost from their per-byte cost
SIZE_SPREAD = 2.0


def dense_backward(calls: pd.DataFrame) -> pd.Series:
    """Which of `calls` (per-call samples: `kind`, `group`) are data-parallel groups' lookup_bwd."""
    return (calls["kind"] == "lookup_bwd") & (calls["group"] == DENSE_KERNEL_TYPE)


def dense_scale(dense: pd.DataFrame, a_s: float, b_s: float) -> float | None:
    """The dense TBE's backward per unit of work as a multiple of the fused line's `b_s`.

    Args:
        dense: the data-parallel groups' lookup_bwd samples, per call (`fit.per_call`), with a
            `profile` column.
        a_s, b_s: the fused kernels' line (fixed cost per call, seconds per unit of work).
    Returns:
        The median over (profile, rank) of each one's median call less `a_s`, per `b_s` × work
        (≥ 0); None where `b_s` is not positive or no call has work.
    """
    med = dense.groupby(["profile", "rank"])[["x", "y"]].median()
    med = med[med["x"] > 0]
    if b_s <= 0 or med.empty:
        return None
    return float(max(0.0, ((med["y"] - a_s) / (b_s * med["x"])).median()))


def with_dense_scale(calls: pd.DataFrame, scale: float | None) -> pd.DataFrame:
    """`calls` with the data-parallel lookup_bwd samples' work multiplied by `scale`, so the
    fused line prices them; `calls` itself where there is no scale or no such sample."""
    if scale is None or "group" not in calls:
        return calls
    dense = dense_backward(calls)
    if not dense.any():
        return calls
    out = calls.copy()
    out.loc[dense, "x"] = out.loc[dense, "x"] * scale
    return out


def replicated(manifest: Mapping[str, Any], trainer_only: bool = False) -> tuple[float, float]:
    """(elements, bytes) of the weights of the profile's data-parallel tables, which every rank
    holds whole; (0, 0) where the plan has none with recorded sizes.

    Args:
        manifest: the profile's manifest (`tables`, `sharding`, `splits`).
        trainer_only: leave out the parts of split tables: SparseLift applies their table's
            row-wise Adagrad in backward (`plans.replicated`), not the trainer's optimizer.
    """
    sizes = {t.get("name"): t for t in manifest.get("tables") or [] if isinstance(t, Mapping)}
    splits = [s for s in manifest.get("splits") or [] if isinstance(s, Mapping)]
    parts = {p for s in splits for p in s.get("parts", ())}
    elements = weight_bytes = 0.0
    for e in manifest.get("sharding") or []:
        t = sizes.get(e.get("table")) if isinstance(e, Mapping) else None
        if t is None or e.get("sharding_type") != DENSE_KERNEL_TYPE:
            continue
        if trainer_only and e.get("table") in parts:
            continue
        n = float(t.get("num_embeddings", 0)) * float(t.get("embedding_dim", 0))
        elements += n
        weight_bytes += n * WEIGHT_BYTES.get(str(t.get("data_type", "fp32")), 4.0)
    return elements, weight_bytes


def dp_allreduce_fit(nodes: pd.DataFrame) -> OpFit | None:
    """What the data-parallel tables' gradient all-reduce costs a step: a fixed cost for their
    call (TorchRec's data-parallel lookup all-reduces in a DDP of its own, one call more than the
    dense module's) and a cost per byte.

    Each call of a step is a bucket of its own size: per size, the median call's transfer (a peer
    thread scheduled late makes one call several times slower, and a few profiled calls must not
    let one such call price every data-parallel table). Where the sizes are at least
    `SIZE_SPREAD` apart (the dense module's call and the tables' own), a line through the
    sizes' medians tells the call's fixed cost from its bytes. Where they are not (a profile
    without data-parallel tables), they cannot: each term is then taken at the most the calls
    allow, the fixed cost at the median call's transfer and the per-byte cost at the calls'
    seconds over their bytes, so that neither a small table's call nor a large table's bytes are
    priced below what they may cost (the fit says so: `bound`). (A rate alone prices a small
    table's call at a fraction of the latency every call pays, which on ranks that share cores
    is most of the call.)

    Args:
        nodes: graph nodes (`kind`, `part`, `bytes`, `transfer_s`, `dur_s` columns).
    Returns:
        The fit, or None when the profile has no such call.
    """
    if nodes.empty:
        return None
    dp = nodes[
        (nodes["kind"] == "dp_allreduce") & (nodes["part"] == "collective") & (nodes["bytes"] > 0)
    ]
    per_size = dp["transfer_s"].fillna(dp["dur_s"]).groupby(dp["bytes"]).median().dropna()
    if per_size.empty:  # no such call, or none timed
        return None
    sizes = per_size.index.to_numpy(dtype=np.float64)
    seconds = per_size.to_numpy(dtype=np.float64)
    rate = float(seconds.sum() / sizes.sum())
    if sizes.max() >= SIZE_SPREAD * sizes.min():
        b, a = (float(v) for v in np.polyfit(sizes, seconds, 1))
        if b < 0.0:  # no cost that grows with the bytes: every call costs about the same
            a, b = float(np.median(seconds)), 0.0
        elif a < 0.0:
            a, b = 0.0, rate
        bound = False
    else:
        a, b, bound = float(np.median(seconds)), rate, True
    return OpFit(
        x=UNITS["dp_allreduce"], a_s=a, b_s=b, r2=0.0, n=int(len(dp)), overlap=0.0, bound=bound
    )


def tables_allreduce_s(manifest: Mapping[str, Any], ops: Mapping[str, OpFit]) -> float:
    """Seconds a step of the profile's plan spends in the data-parallel tables' gradient
    all-reduce, as the optimizer prices it: their call's fixed cost and 2·(W−1)/W of their
    weights' bytes (ring) at `dp_allreduce`'s per-byte cost, less its overlap share.

    Args:
        manifest: the profile's manifest (`world_size`, `tables`, `sharding`).
        ops: the fits (0 without a `dp_allreduce` fit).
    Returns:
        Seconds per step; 0 where the plan has no data-parallel table with recorded sizes.
    """
    fit = ops.get("dp_allreduce")
    world = manifest.get("world_size")
    if fit is None or not isinstance(world, int) or world < 2:
        return 0.0
    weight_bytes = replicated(manifest)[1]
    if weight_bytes <= 0:
        return 0.0
    ring = ring_allreduce_bytes(world, weight_bytes)
    return (1.0 - (fit.overlap or 0.0)) * (max(0.0, fit.a_s) + fit.b_s * ring)


def tables_optimizer_s(manifest: Mapping[str, Any], ops: Mapping[str, OpFit]) -> float:
    """Seconds a step of the profile's plan spends in the trainer's dense optimizer pass over
    its data-parallel tables, as the optimizer prices it (0 without a `dense_optimizer` fit)."""
    fit = ops.get(DENSE_OPTIMIZER)
    return 0.0 if fit is None else fit.b_s * replicated(manifest)[0]


def dense_optimizer_fit(evidence: Sequence[ProfileEvidence]) -> OpFit | None:
    """The trainer's dense optimizer pass per element of replicated table weights: the line, over
    the profiles, of their dense work outside forward and backward (median over ranks and quiet
    steps) against their data-parallel tables' elements, within each job (`job_levels.job_of`).

    Within a job: separate jobs of one plan run up to 1.5× apart, which would read as a slope.
    Measured only where the line stands out of the profiles' scatter about it (slope ≥ 2
    standard errors, which takes a job of at least three profiles): the profiles of one plan
    differ by more than their steps do, and a slope within that noise would price the replicas'
    pass at whatever the noise gave, near free as readily as dear. CPU profiles only: on CUDA
    the main thread launches the pass, and its time there does not grow with the elements.

    Args:
        evidence: the profiles fitted together.
    Returns:
        The fit (x = elements, a_s = 0: the dense module's own pass is in the dense step; `n`:
        the profiles fitted); None where the slope is not resolved, or the profiles ran on CUDA.
    """
    rows = [
        (
            job_of(ev),
            replicated(ev.manifest, trainer_only=True)[0],
            float(np.median(ev.dense_other_s)),
        )
        for ev in evidence
        if ev.device == "cpu" and ev.dense_other_s
    ]
    if not rows:
        return None
    profiles = pd.DataFrame(rows, columns=["job", "x", "y"])
    within = profiles.groupby("job")[["x", "y"]].transform(lambda c: c - c.mean())
    dof = len(profiles) - profiles["job"].nunique() - 1
    sxx = float((within["x"] ** 2).sum())
    if sxx <= 0 or dof < 1:
        return None
    b = float((within["x"] * within["y"]).sum()) / sxx
    resid = within["y"] - b * within["x"]
    se = float(np.sqrt((resid**2).sum() / dof / sxx))
    if not (b > 0 and b >= 2.0 * se):
        return None
    total = float((within["y"] ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 0.0
    return OpFit(x=DENSE_OPTIMIZER_UNIT, a_s=0.0, b_s=b, r2=r2, n=len(profiles))
