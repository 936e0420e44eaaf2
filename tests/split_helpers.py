"""Constructed split cases the optimizer tests share: a heavy multi-hot table among light ones,
measured hot ids for it, and the CPU preset with the split model's own costs set as measured."""

from __future__ import annotations

import numpy as np

from sparselift.optimizer.coefficients import MEASURED, Linear, from_topology
from sparselift.optimizer.table_stats import TableStats
from sparselift.profiler.hot_ids import HotIds

BATCH = 512


def split_hot_ids(table: str, rows: int, hot_rows: int, hot_share: float) -> HotIds:
    """`hot_rows` ids (every 7th row) taking `hot_share` of 1,000,000 lookups, hottest first."""
    lookups = 1_000_000
    weights = 1.0 / np.arange(1, hot_rows + 1)
    counts = np.maximum(1, np.floor(weights / weights.sum() * hot_share * lookups)).astype(np.int64)
    ids = (np.arange(hot_rows, dtype=np.int64) * 7) % rows
    return HotIds(table, ids, counts, lookups, hot_rows + 50_000, rows, capped=False)


def split_tables() -> list[TableStats]:
    """One heavy multi-hot table whose lookups pile up on its owner, and four light ones."""
    heavy = TableStats("heavy", 200_000, 64, 300.0, zipf_alpha=1.2, feature_names=("f_heavy",))
    light = [
        TableStats(f"t{i}", 5_000, 64, 2.0, zipf_alpha=1.05, feature_names=(f"f{i}",))
        for i in range(4)
    ]
    return [heavy, *light]


def split_coeffs(topo, transform_b_s: float, recombine_b_s: float = 1e-12):
    """The CPU preset with the split model's costs measured: the batch transform at
    `transform_b_s` per id, the recombination at `recombine_b_s` per pooled element."""
    c = from_topology(topo, dense_step_s=0.01).replace(
        batch_transform=Linear(20e-6, transform_b_s), recombine_b_s=recombine_b_s
    )
    return c.with_evidence(MEASURED, "test", ("batch_transform", "recombine_b_s"))
