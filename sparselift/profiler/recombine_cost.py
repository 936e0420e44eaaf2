"""Time the split model's recombination of pooled embeddings on the profiled device.

Why: a model with split tables recombines the virtual features' pooled embeddings into the
original features' ones every step (`sparselift.plans.rewrite.recombine`, forward and backward),
and the optimizer prices that per pooled element (`Coefficients.recombine_b_s`): each split
table's parts read, plus the model's whole pooled output written once more; without a
measurement it can only assume a preset's cost.

At the end of the window each rank builds, on its device, a float32 pooled tensor of the model's
pooled tables (their `embedding_dim` × features each) for its batch (the last captured KJT's),
as the inner collection of the split model hands it over, and times forward and backward of the
recombination (`torch.autograd.grad` with a gradient of ones, held apart) with the first k
tables split hot/cold, for k = 0 (the baseline: every block a view), 1, 2, 4, 8, … up to every
table. A sample is (elements read: the split tables' parts, elements written: the whole output,
seconds), each time the fastest of `REPEATS` calls after one untimed call: on a shared host other
processes only ever add time. The timing stops starting split sets once `TIME_BUDGET_S` is spent,
and times fewer rows than the batch where the largest set would hold more than `BYTES_MAX`
(the cost is per element), so that it never holds training up for long nor takes much memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from sparselift.profiler.access import Capture, TableMeta
from sparselift.profiler.transform_cost import device_sync

if TYPE_CHECKING:
    from sparselift.plans.rewrite import Layout

REPEATS = 5  # timed calls per split set and pass (the fastest of all counts)
PASSES = 3  # passes over the split sets while the budget lasts (noise bursts spread out)
TIME_BUDGET_S = 0.5  # stop timing further split sets past this, per rank
BYTES_MAX = 256 << 20  # what the largest split set's tensors may hold (else fewer rows)
FLOAT_BYTES = 4


@dataclass
class RankRecombine:
    """One rank's timings of the recombination (what it sends to rank 0).

    Attributes:
        rank: the rank.
        device: where it was timed ("cpu" or "cuda").
        rows: batch rows timed (the rank's batch, or fewer where it would not fit `BYTES_MAX`).
        samples: per split set: split (tables split hot/cold), read (pooled elements of their
            parts), written (pooled elements of the output), seconds (fastest call, forward
            and backward).
        elapsed_s: what the timing took on this rank, all told.
        repeats: timed calls per split set.
    """

    rank: int
    device: str
    rows: int
    samples: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    repeats: int = REPEATS


def time_recombine(
    tables: list[TableMeta],
    captures: list[Capture],
    device: torch.device,
    rank: int,
    *,
    repeats: int = REPEATS,
    budget_s: float = TIME_BUDGET_S,
) -> RankRecombine | None:
    """Time the split model's recombination at this rank's batch and the model's pooled widths.

    Args:
        tables: the sharded modules' tables (`access.table_metas`); sequence tables (pooling
            NONE) have no pooled output and are left out.
        captures: this rank's captured KJTs over the window (the last one's batch is timed).
        device: this rank's device (where the pooled embeddings are).
        rank: this rank.
        repeats: timed calls per split set.
        budget_s: stop starting split sets once this much time is spent (the baseline is
            always timed).
    Returns:
        The timings, or None without a pooled table or a captured batch.
    Raises:
        Whatever torch raises (e.g. out of memory); the session records it and training goes on.
    """
    from torchrec.sparse.jagged_tensor import KeyedTensor

    from sparselift.plans.rewrite import recombine

    t_start = time.perf_counter()
    pooled = [t for t in tables if t.pooling_type != "NONE" and t.features]
    if not pooled or not captures:
        return None
    batch = int(captures[-1].kjt.stride())
    widths = [t.embedding_dim * len(t.features) for t in pooled]
    written_w = sum(widths)
    # the largest set (every table split): its pooled input (2W) and gradient (2W), then the
    # output, its gradient and the parts' sums (W each)
    per_row = FLOAT_BYTES * 7 * written_w
    rows = max(1, min(batch, BYTES_MAX // per_row))
    sync = device_sync(device)
    out = RankRecombine(rank=rank, device=device.type, rows=rows, repeats=repeats)
    counts = split_counts(len(pooled))
    best: dict[int, float] = {}
    with torch.enable_grad():
        grad = torch.ones(rows, written_w, device=device)
        for k in counts * PASSES:
            if best and time.perf_counter() - t_start > budget_s:
                break
            keys, lengths, layout = layout_of(pooled, k)
            values = torch.zeros(rows, sum(lengths), device=device, requires_grad=True)
            kt = KeyedTensor(keys=keys, length_per_key=lengths, values=values)

            def call(kt: Any = kt, values: torch.Tensor = values, layout: Any = layout) -> None:
                torch.autograd.grad(recombine(kt, layout).values(), values, grad)

            call()  # untimed: the first call allocates
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                best[k] = min(best.get(k, float("inf")), time.perf_counter() - t0)
            del kt, values
    out.samples = [
        dict(
            split=k,
            read=rows * 2 * sum(widths[:k]),  # hot/cold: each split table's two parts
            written=rows * written_w,
            seconds=best[k],
        )
        for k in counts
        if k in best
    ]
    out.elapsed_s = time.perf_counter() - t_start
    return out


def recombine_record(timings: list[RankRecombine | None]) -> dict[str, Any] | None:
    """Rank 0: the manifest's `recombine` record of every rank's timings, with its fit.

    Args:
        timings: each rank's `time_recombine`, in rank order (None where a rank timed nothing).
    Returns:
        {device, repeats, rows[rank], elapsed_s[rank], samples[{rank, split, read, written,
        seconds}], b_s, r2} (rows / elapsed_s null for a rank without timings; b_s, r2 null
        without a sample), or None when no rank timed.
    """
    from sparselift.analysis.recombine_fit import RecombineSample, fit_recombine

    got = [t for t in timings if t is not None]
    if not got:
        return None
    samples = [dict(rank=t.rank, **s) for t in got for s in t.samples]
    fit = fit_recombine([RecombineSample(s["read"], s["written"], s["seconds"]) for s in samples])
    return dict(
        device=got[0].device,
        repeats=got[0].repeats,
        rows=[t.rows if t is not None else None for t in timings],
        elapsed_s=[t.elapsed_s if t is not None else None for t in timings],
        samples=samples,
        b_s=fit.b_s if fit is not None else None,
        r2=fit.r2 if fit is not None else None,
    )


def split_counts(n: int) -> list[int]:
    """0, 1, 2, 4, 8, … tables split, then all `n` (each at most once, none above `n`)."""
    counts, k = [0], 1
    while k < n:
        counts.append(k)
        k *= 2
    return counts + [n] if n > 0 else counts


def layout_of(tables: list[TableMeta], k: int) -> tuple[list[str], list[int], Layout]:
    """The pooled keys, their widths and the recombination's layout (`rewrite.Layout`) of the
    split model of `tables` with the first `k` split hot/cold, as `rewrite.VirtualTables`
    builds them: a split table's parts in part order, each with every feature's virtual one."""
    from sparselift.plans.splits import part_names, virtual_feature

    keys: list[str] = []
    lengths: list[int] = []
    layout: list[tuple[str, int, tuple[tuple[str, int], ...]]] = []
    for i, t in enumerate(tables):
        if i >= k:
            keys += list(t.features)
            lengths += [t.embedding_dim] * len(t.features)
            layout += [(f, t.embedding_dim, ((f, -1),)) for f in t.features]
            continue
        parts = part_names(t.name, "hot_cold")
        for p in parts:
            keys += [virtual_feature(f, p) for f in t.features]
            lengths += [t.embedding_dim] * len(t.features)
        layout += [
            (f, t.embedding_dim, tuple((virtual_feature(f, p), -1) for p in parts))
            for f in t.features
        ]
    return keys, lengths, tuple(layout)
