"""Per-group sums and keys over compact arrays, equal to the bit to what pandas gives per group.

The analysis merges per-rank results, so a per-group sum (a step's mean over ranks, a call's
transfer time) must not depend on how the rows were split: `ordered_sums` adds each group's values
in their order exactly as numpy adds a 1-D array (pairwise), which is what `Series.sum` and
`Series.mean` do, and which a grouped sum (`groupby(...).sum()`, compensated) does not always
match in the last bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def ordered_sums(values: np.ndarray, codes: np.ndarray, n: int) -> np.ndarray:
    """The sum of `values` per group `0..n-1`, each group's values added in their order.

    Args:
        values: float64 values, one per row.
        codes: each row's group (0..n-1; rows with a negative code are left out).
        n: the number of groups.
    Returns:
        float64 array of length n; 0.0 for a group without rows. Each entry equals
        `np.sum(values[codes == g])` (and so `Series.sum` of that group) exactly.
    """
    values = np.asarray(values, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    keep = codes >= 0
    values, codes = values[keep], codes[keep]
    out = np.zeros(n, dtype=np.float64)
    if not len(codes):
        return out
    order = np.argsort(codes, kind="stable")
    sorted_values = values[order]
    counts = np.bincount(codes, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # a row-wise sum along the contiguous axis is numpy's 1-D (pairwise) sum of each row, so the
    # groups of one size are summed in one call
    for size in np.unique(counts[counts > 0]):
        groups = np.nonzero(counts == size)[0]
        out[groups] = sorted_values[starts[groups][:, None] + np.arange(size)].sum(axis=1)
    return out


def group_codes(frame: pd.DataFrame, keys: list[str]) -> tuple[np.ndarray, int]:
    """Each row's group under `keys` (numbered in sorted key order, missing values last), and the
    number of groups: the numbering `frame.groupby(keys, dropna=False)` iterates in."""
    if frame.empty:
        return np.zeros(0, dtype=np.int64), 0
    codes = frame.groupby(keys, dropna=False, sort=True).ngroup().to_numpy(dtype=np.int64)
    return codes, int(codes.max()) + 1
