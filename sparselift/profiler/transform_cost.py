"""Time the batch transform of split plans on a real batch of the profiled run, on its device.

Why: a plan with splits runs `sparselift.plans.transform.BatchTransform` on every rank's batch
each step, and the optimizer prices it per split feature and per id routed
(`Coefficients.batch_transform`); without a measurement it can only assume a preset's cost.

At the end of the window each rank takes the last KJT each sharded module received (the access
capture) and times, on that KJT's device, the transform without splits (the baseline) and with
hot/cold splits of up to `MAX_TABLES` of the module's tables: each one alone, then the first 2,
4, 8, 16 together. A table's hot ids are its hottest in this rank's last step
(`hot_ids.select_hot`, covering `HOT_COVERAGE` of its lookups). Each time is the fastest of
`REPEATS` calls after one untimed call (which builds the routes, as the loader does once): on a
shared host other processes only ever add time. A sample is what a split set adds to the
baseline. The timing stops once `TIME_BUDGET_S` is spent
and skips a split set whose routes would hold more than `ROUTE_BYTES_MAX`, so that it never
holds training up for long nor takes much memory; peak memory is read before it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sparselift.profiler.access import Capture, TableMeta, clean_path
from sparselift.profiler.access_stats import TableStep
from sparselift.profiler.hot_ids import select_hot

MAX_TABLES = 16  # tables split on their own per rank (spread over the model's tables)
GROUP_SIZES = (2, 4, 8, 16)  # … then the first this many of them together
REPEATS = 5  # timed calls per split set (the fastest counts)
HOT_COVERAGE = 0.5  # each table's hot part covers this share of its lookups in the batch
TIME_BUDGET_S = 1.0  # stop timing further split sets past this, per rank
ROUTE_BYTES_MAX = 64 << 20  # skip a split set whose id lookup tables would hold more


@dataclass
class RankTransform:
    """One rank's timings of the batch transform (what it sends to rank 0).

    Attributes:
        rank: the rank.
        device: where the batch was ("cpu" or "cuda").
        baseline_s: the batch transformed without splits (fastest call; the median over the
            modules where there are several).
        samples: per split set: tables (names), features (split features), ids (ids they
            route), seconds (fastest call less its module's baseline; may be < 0 from noise).
        elapsed_s: what the timing took on this rank, all told.
        repeats: timed calls per split set.
    """

    rank: int
    device: str
    baseline_s: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    repeats: int = REPEATS


@dataclass
class _Job:
    """One module's batch and how its tables are split."""

    kjt: Any
    model: list[Any]  # TableFingerprint per table of the module
    chosen: list[TableMeta]  # tables to split, in model order
    ids: dict[str, int]  # ids of each chosen table's features in the batch
    hot: dict[str, tuple[int, ...]]


@torch.no_grad()  # a feature processor's weights require grad; the data path's ids have none
def time_transform(
    tables: list[TableMeta],
    captures: list[Capture],
    steps: list[TableStep],
    rank: int,
    *,
    max_tables: int = MAX_TABLES,
    repeats: int = REPEATS,
    budget_s: float = TIME_BUDGET_S,
) -> RankTransform | None:
    """Time the batch transform on this rank's last captured batch.

    Args:
        tables: the sharded modules' tables (`access.table_metas`).
        captures: this rank's captured KJTs over the window.
        steps: this rank's access statistics (`access_stats.rank_table_steps`): the last
            step's id histograms give the hot ids.
        rank: this rank.
        max_tables: at most this many tables split, spread over the modules' tables.
        repeats: timed calls per split set.
        budget_s: stop starting split sets once this much time is spent.
    Returns:
        The timings, or None when nothing was captured.
    Raises:
        Whatever the transform raises on this batch (`PlanError`: e.g. a variable batch per
        feature); the session records it and training goes on.
    """
    t_start = time.perf_counter()
    jobs = _jobs(tables, captures, steps, max_tables)
    if not jobs:
        return None
    device = jobs[0].kjt.values().device
    sync = device_sync(device)

    def timed(transform: Any, kjt: Any) -> float:
        transform(kjt)  # untimed: builds the routes (once per plan in the loader)
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            transform(kjt)
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    out = RankTransform(rank=rank, device=device.type, baseline_s=0.0, repeats=repeats)
    base = [timed(_transform(job, []), job.kjt) for job in jobs]
    out.baseline_s = float(statistics.median(base))
    for job, base_s in zip(jobs, base, strict=True):
        for chosen in _split_sets(job):
            if time.perf_counter() - t_start > budget_s:
                break
            if _route_bytes(chosen, job.hot) > ROUTE_BYTES_MAX:
                continue
            s = timed(_transform(job, chosen), job.kjt) - base_s
            out.samples.append(
                dict(
                    tables=[t.name for t in chosen],
                    features=sum(len(t.features) for t in chosen),
                    ids=sum(job.ids[t.name] for t in chosen),
                    seconds=s,
                )
            )
    out.elapsed_s = time.perf_counter() - t_start
    return out


def transform_record(timings: list[RankTransform | None]) -> dict[str, Any] | None:
    """Rank 0: the manifest's `batch_transform` record of every rank's timings, with its fit.

    Args:
        timings: each rank's `time_transform`, in rank order (None where a rank timed
            nothing).
    Returns:
        {device, repeats, hot_coverage, baseline_s[rank], elapsed_s[rank], samples[{rank,
        tables, features, ids, seconds}], a_s, b_s, r2} (baseline_s / elapsed_s null for a
        rank without timings; a_s, b_s, r2 null without a sample), or None when no rank timed.
    """
    from sparselift.analysis.transform_fit import TransformSample, fit_transform

    got = [t for t in timings if t is not None]
    if not got:
        return None
    samples = [dict(rank=t.rank, **s) for t in got for s in t.samples]
    fit = fit_transform([TransformSample(s["features"], s["ids"], s["seconds"]) for s in samples])
    return dict(
        device=got[0].device,
        repeats=got[0].repeats,
        hot_coverage=HOT_COVERAGE,
        baseline_s=[t.baseline_s if t is not None else None for t in timings],
        elapsed_s=[t.elapsed_s if t is not None else None for t in timings],
        samples=samples,
        a_s=fit.a_s if fit is not None else None,
        b_s=fit.b_s if fit is not None else None,
        r2=fit.r2 if fit is not None else None,
    )


def device_sync(device: torch.device) -> Callable[[], None]:
    """What waits for `device`'s queued work before a clock is read (nothing on CPU)."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _jobs(
    tables: list[TableMeta], captures: list[Capture], steps: list[TableStep], max_tables: int
) -> list[_Job]:
    """Per sharded module, its last captured batch and the tables to split in it."""
    from sparselift.plans.types import TableFingerprint

    if not captures:
        return []
    last = max(c.step for c in captures)
    kjts: dict[str, Any] = {}
    for c in captures:
        if c.step == last:
            kjts[clean_path(c.module)] = c.kjt  # the module's last call of the step
    hist = {s.table: s for s in steps if s.step == last}
    per_module: list[tuple[Any, list[TableMeta], dict[str, int]]] = []
    for module, kjt in kjts.items():
        lengths = dict(zip(kjt.keys(), kjt.length_per_key(), strict=True))
        mine = [t for t in tables if t.module == module]
        if mine and all(f in lengths for t in mine for f in t.features):
            ids = {t.name: int(sum(lengths[f] for f in t.features)) for t in mine}
            per_module.append((kjt, mine, ids))
    candidates = [(i, t) for i, (_, mine, _) in enumerate(per_module) for t in mine]
    if len(candidates) > max_tables:  # spread over the tables, first and last included
        picks = np.linspace(0, len(candidates) - 1, max_tables).round().astype(int)
        candidates = [candidates[j] for j in sorted(set(picks.tolist()))]
    jobs = []
    for i, (kjt, mine, ids) in enumerate(per_module):
        chosen = [t for j, t in candidates if j == i]
        if not chosen:
            continue
        model = [
            TableFingerprint(t.name, t.num_embeddings, t.embedding_dim, tuple(t.features))
            for t in mine
        ]
        hot = {t.name: _hot_ids(t, hist.get(t.name)) for t in chosen}
        jobs.append(_Job(kjt, model, chosen, ids, hot))
    return jobs


def _hot_ids(t: TableMeta, step: TableStep | None) -> tuple[int, ...]:
    """The table's hottest ids in the batch (row 0 where it had none)."""
    if step is None or step.uniq.numel() == 0:
        return (0,)
    hot = select_hot(
        t.name, step.uniq.numpy(), step.counts.numpy(), t.num_embeddings, coverage=HOT_COVERAGE
    )
    return tuple(int(x) for x in hot.ids) or (0,)


def _split_sets(job: _Job) -> list[list[TableMeta]]:
    """Each chosen table alone, then the first 2, 4, 8, 16 of them together."""
    sets = [[t] for t in job.chosen]
    sets += [job.chosen[:k] for k in GROUP_SIZES if k <= len(job.chosen)]
    return sets


def _route_bytes(chosen: list[TableMeta], hot: dict[str, tuple[int, ...]]) -> int:
    """About what the transform's routing tables of `chosen` hold (`routing.build_tables`: one
    per table, whatever its features)."""
    from sparselift.plans.routing import LOOKUP_TABLE_MAX_ROWS

    total = 0
    for t in chosen:
        dense = t.num_embeddings <= LOOKUP_TABLE_MAX_ROWS  # a table of every row, else the hot ids
        per = 8 * t.num_embeddings if dense else 16 * len(hot[t.name])
        total += per
    return total


def _transform(job: _Job, chosen: list[TableMeta]) -> Any:
    """The batch transform of `job`'s module with each table of `chosen` split hot/cold."""
    from sparselift.plans.splits import part_names
    from sparselift.plans.transform import BatchTransform
    from sparselift.plans.types import Split

    splits = [
        Split(
            table=t.name,
            kind="hot_cold",
            parts=part_names(t.name, "hot_cold"),
            hot_ids=job.hot[t.name],
        )
        for t in chosen
    ]
    return BatchTransform(job.model, splits, "the profiler's transform timing")
