"""Access statistics of embedding tables from captured KJTs, checked against ground truth in tests.

Per (table, rank, step) a rank computes what needs only its own batch (ids, exact unique ids,
pooling factors, id bytes) and the compact id histogram (unique ids and their counts). Rank 0
merges the histograms of all ranks and steps per table, which defines the table's hot rows (the top
1 % / 10 % of its rows by observed frequency over the whole window) and its Zipf exponent
(`zipf.py`); each row's top shares are the share of its lookups that hit those hot rows. The same
merged histograms (`table_histograms`) give the hot-id file (`hot_ids.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from sparselift.profiler.access import Capture, TableMeta
from sparselift.profiler.zipf import fit_zipf_alpha

# Column order of access_stats.parquet (docs/CONTRACTS.md).
COLUMNS = (
    "table",
    "rank",
    "step",
    "num_embeddings",
    "embedding_dim",
    "batch_size",
    "ids",
    "unique_ids",
    "pooling_mean",
    "pooling_p50",
    "pooling_p99",
    "pooling_max",
    "top1pct_share",
    "top10pct_share",
    "id_bytes",
    "zipf_alpha",
)


@dataclass
class TableStep:
    """One table on one rank in one step; `uniq`/`counts` travel to rank 0 and are then dropped."""

    table: str
    rank: int
    step: int
    batch_size: int
    ids: int
    unique_ids: int
    pooling_mean: float
    pooling_p50: float
    pooling_p99: float
    pooling_max: int
    id_bytes: int
    uniq: torch.Tensor
    counts: torch.Tensor


def table_step(table: TableMeta, rank: int, step: int, kjt: Any) -> TableStep:
    """Statistics of `table`'s features in one KJT (the rank's local batch)."""
    per_key = kjt.to_dict()
    feats = [per_key[f] for f in table.features if f in per_key]
    if feats:
        values = torch.cat([jt.values().detach().reshape(-1).cpu() for jt in feats])
        lengths = torch.cat([jt.lengths().detach().reshape(-1).cpu() for jt in feats])
        itemsize = feats[0].values().element_size()
    else:
        values, lengths, itemsize = (
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, dtype=torch.int64),
            8,
        )
    return table_step_from_tensors(
        table.name, rank, step, int(kjt.stride()), values, lengths, itemsize
    )


def table_step_from_tensors(
    table: str,
    rank: int,
    step: int,
    batch_size: int,
    values: torch.Tensor,
    lengths: torch.Tensor,
    itemsize: int = 8,
) -> TableStep:
    """Statistics of one table's ids (`values`) and ids per bag (`lengths`) in one step.

    Args:
        table: the table's name.
        rank: the rank that saw them.
        step: the training step.
        batch_size: samples in the rank's batch.
        values: every id looked up, in any integer dtype.
        lengths: ids per bag (sample × feature).
        itemsize: bytes per id as sent (the KJT's dtype).
    """
    uniq, counts = torch.unique(values.to(torch.int64), return_counts=True)
    if lengths.numel():
        q = torch.quantile(
            lengths.to(torch.float64), torch.tensor([0.5, 0.99], dtype=torch.float64)
        )
        pooling = (
            float(lengths.sum()) / lengths.numel(),
            float(q[0]),
            float(q[1]),
            int(lengths.max()),
        )
    else:
        pooling = (0.0, 0.0, 0.0, 0)
    return TableStep(
        table=table,
        rank=rank,
        step=step,
        batch_size=batch_size,
        ids=int(values.numel()),
        unique_ids=int(uniq.numel()),
        pooling_mean=pooling[0],
        pooling_p50=pooling[1],
        pooling_p99=pooling[2],
        pooling_max=pooling[3],
        id_bytes=int(values.numel()) * itemsize,
        uniq=uniq,
        counts=counts,
    )


def rank_table_steps(
    tables: list[TableMeta], captures: list[Capture], rank: int
) -> list[TableStep]:
    """Every (table, step) this rank captured; a module seen twice in a step counts both KJTs."""
    by_module: dict[str, list[TableMeta]] = {}
    for t in tables:
        by_module.setdefault(t.module, []).append(t)
    from sparselift.profiler.access import clean_path

    out: dict[tuple[str, int], TableStep] = {}
    for cap in captures:
        for t in by_module.get(clean_path(cap.module), []):
            ts = table_step(t, rank, cap.step, cap.kjt)
            key = (t.name, cap.step)
            out[key] = _merge(out[key], ts) if key in out else ts
    return sorted(out.values(), key=lambda s: (s.step, s.table))


def _merge(a: TableStep, b: TableStep) -> TableStep:
    """Two KJTs of one table in one step (micro-batches): counts summed, pooling ids-weighted."""
    uniq, counts = merge_histograms([(a.uniq, a.counts), (b.uniq, b.counts)])
    bags_a = a.ids / a.pooling_mean if a.pooling_mean else 0
    bags_b = b.ids / b.pooling_mean if b.pooling_mean else 0
    ids = a.ids + b.ids
    return TableStep(
        table=a.table,
        rank=a.rank,
        step=a.step,
        batch_size=a.batch_size + b.batch_size,
        ids=ids,
        unique_ids=int(uniq.numel()),
        pooling_mean=ids / (bags_a + bags_b) if bags_a + bags_b else 0.0,
        pooling_p50=max(a.pooling_p50, b.pooling_p50),
        pooling_p99=max(a.pooling_p99, b.pooling_p99),
        pooling_max=max(a.pooling_max, b.pooling_max),
        id_bytes=a.id_bytes + b.id_bytes,
        uniq=uniq,
        counts=counts,
    )


class IdHistogram(NamedTuple):
    """How often each id was looked up: sorted unique ids and their counts."""

    ids: torch.Tensor
    counts: torch.Tensor


def merge_histograms(hists: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> IdHistogram:
    """Sum (unique ids, counts) histograms into one."""
    hists = list(hists)
    if not hists:
        return IdHistogram(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int64))
    ids = torch.cat([h[0] for h in hists])
    cnt = torch.cat([h[1] for h in hists])
    uniq, inv = torch.unique(ids, return_inverse=True)
    counts = torch.zeros(uniq.numel(), dtype=torch.int64).index_add_(0, inv, cnt.to(torch.int64))
    return IdHistogram(uniq, counts)


def hot_rows(
    uniq: torch.Tensor, counts: torch.Tensor, num_embeddings: int, share: float
) -> torch.Tensor:
    """Ids of the top `share` of the table's rows by observed frequency (sorted)."""
    k = max(1, math.ceil(share * num_embeddings))
    order = torch.argsort(counts, descending=True, stable=True)
    return torch.sort(uniq[order[:k]]).values


def hit_share(step: TableStep, hot: torch.Tensor) -> float:
    """The share of `step`'s lookups that hit the ids in `hot` (0 for a step without lookups)."""
    if step.ids == 0:
        return 0.0
    return float(step.counts[torch.isin(step.uniq, hot)].sum()) / step.ids


class AccessStats(NamedTuple):
    """What rank 0 makes of every rank's TableSteps."""

    rows: list[dict[str, Any]]  # rows of access_stats.parquet, keys in COLUMNS order
    zipf_alphas: dict[str, float | None]  # fitted per table; None where the fit is undefined


def table_histograms(steps: list[TableStep]) -> dict[str, IdHistogram]:
    """Rank 0: each table's id histogram over all its steps on all ranks (sparse: only the ids
    seen, never a dense array of the table's rows), in order of first appearance."""
    by_table: dict[str, list[TableStep]] = {}
    for s in steps:
        by_table.setdefault(s.table, []).append(s)
    return {
        name: merge_histograms((s.uniq, s.counts) for s in group)
        for name, group in by_table.items()
    }


def access_rows(
    tables: list[TableMeta],
    steps: list[TableStep],
    histograms: dict[str, IdHistogram] | None = None,
) -> AccessStats:
    """Rank 0: the rows of access_stats.parquet and the fitted Zipf exponent of each table.

    A table's hot rows (top 1 % / 10 %) and exponent come from all its steps on all ranks
    together; each row's top shares are the share of that step's lookups hitting them.

    Args:
        tables: the tables as the sharded modules declare them.
        steps: every rank's TableSteps.
        histograms: `table_histograms(steps)` if the caller already merged them (the hot ids
            use the same histograms); merged here otherwise.
    """
    meta = {t.name: t for t in tables}
    by_table: dict[str, list[TableStep]] = {}
    for s in steps:
        by_table.setdefault(s.table, []).append(s)
    hists = histograms if histograms is not None else table_histograms(steps)
    rows, alphas = [], {}
    for name, group in by_table.items():
        t = meta[name]
        uniq, counts = hists[name]
        alpha = fit_zipf_alpha(counts, t.num_embeddings)
        alphas[name] = None if math.isnan(alpha) else alpha  # JSON has no NaN
        hot1 = hot_rows(uniq, counts, t.num_embeddings, 0.01)
        hot10 = hot_rows(uniq, counts, t.num_embeddings, 0.10)
        for s in group:
            rows.append(
                dict(
                    table=name,
                    rank=s.rank,
                    step=s.step,
                    num_embeddings=t.num_embeddings,
                    embedding_dim=t.embedding_dim,
                    batch_size=s.batch_size,
                    ids=s.ids,
                    unique_ids=s.unique_ids,
                    pooling_mean=s.pooling_mean,
                    pooling_p50=s.pooling_p50,
                    pooling_p99=s.pooling_p99,
                    pooling_max=s.pooling_max,
                    top1pct_share=hit_share(s, hot1),
                    top10pct_share=hit_share(s, hot10),
                    id_bytes=s.id_bytes,
                    zipf_alpha=alphas[name],
                )
            )
    rows.sort(key=lambda r: (r["table"], r["rank"], r["step"]))
    return AccessStats(rows, alphas)
