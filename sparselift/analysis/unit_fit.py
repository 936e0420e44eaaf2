"""Refit the CPU lookup unit's weights (κ per distinct row, μ per pooled element, φ per distinct
row and doubling of its shard past the footprint floor) from calls.

A CPU lookup call costs a + b · (ids + κ · unique + μ · bag_elems + φ · far)
(`sparselift.kernels`). One profile's calls mostly scale all the parts together, so their
weights stay the kernel benchmark's (φ: none). Calls of several plans mix them differently (a
row-wise shard splits the distinct rows but writes every rank's bags; a table-wise one keeps all
of a table's rows; large and small tables share ranks differently), and then the linear model
y = a + b₁·ids + b₂·unique + b₃·bag_elems + b₄·far tells them apart: κ = b₂/b₁, μ = b₃/b₁,
φ = b₄/b₁.
A weight is taken only when the data determine it: every coefficient non-negative and each
ratio's relative standard error at most MAX_REL_SE; otherwise the kernel's weight stands.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

MAX_REL_SE = 0.25  # a weight whose standard error exceeds this share of it is not determined
MIN_DOF = 2  # samples beyond the coefficients fitted, for a standard error to mean anything


@dataclass(frozen=True)
class UnitFit:
    """A lookup kind's line in the refitted unit.

    Attributes:
        a_s: fixed seconds per call.
        b_s: seconds per id (the unit).
        kappa: ids one distinct row costs; None when the data do not determine it.
        mu: ids one pooled element costs; None when the data do not determine it.
        n: samples fitted on.
        phi: ids a distinct row costs more per doubling of its shard past the footprint floor
            (`kernels.LookupUnit`); None when the data do not determine it.
    """

    a_s: float
    b_s: float
    kappa: float | None
    mu: float | None
    n: int
    phi: float | None = None


def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient ≥ 0, exactly, by trying each support (few columns).

    Args:
        x: design matrix (samples × columns), at most ~6 columns.
        y: targets.
    Returns:
        The coefficients (0 outside the best support).
    """
    k = x.shape[1]
    best, best_res = np.zeros(k), float(np.sum(y * y))
    for size in range(1, k + 1):
        for cols in itertools.combinations(range(k), size):
            sub = x[:, cols]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < 0):
                continue
            res = float(np.sum((y - sub @ coef) ** 2))
            if res < best_res - 1e-18:
                best_res, best = res, np.zeros(k)
                best[list(cols)] = coef
    return best


def _ratio_se(coef: np.ndarray, cov: np.ndarray, i: int, j: int) -> float:
    """Relative standard error of coef[i] / coef[j] (delta method)."""
    r = coef[i] / coef[j]
    grad = np.zeros(len(coef))
    grad[i], grad[j] = 1.0 / coef[j], -coef[i] / coef[j] ** 2
    return float(np.sqrt(max(grad @ cov @ grad, 0.0)) / abs(r))


def refit_unit(samples: pd.DataFrame, kappa0: float, mu0: float) -> UnitFit | None:
    """Fit y = a + b·(ids + κ·unique + μ·bag_elems + φ·far) over lookup calls of one kind.

    Args:
        samples: one row per call (medians per profile, rank and group): `y`, `ids`, `unique`,
            `bag_elems` and optionally `far` (distinct rows times their shards' doublings past
            `kernels.FOOTPRINT_FLOOR_BYTES`).
        kappa0, mu0: the kernel's weights, kept for a weight the data do not determine (φ: 0).
    Returns:
        The fit, with κ, μ and/or φ where determined (the most weights the data determine, in
        that order of preference); None when none is (the caller keeps the kernel's unit and its
        own line fit).
    """
    y = samples["y"].to_numpy(float)
    far = samples["far"] if "far" in samples else pd.Series(0.0, index=samples.index)
    parts = np.column_stack([samples[["ids", "unique", "bag_elems"]].to_numpy(float), far])
    if len(y) == 0 or not np.any(parts[:, 0] > 0):
        return None
    for size in (3, 2, 1):
        for free in itertools.combinations(range(3), size):
            fit = _try(y, parts, free, (kappa0, mu0, 0.0))
            if fit is not None:
                return fit
    return None


def _try(
    y: np.ndarray, parts: np.ndarray, free: tuple[int, ...], prior: tuple[float, float, float]
) -> UnitFit | None:
    """The fit with the weights at indices `free` (0 κ, 1 μ, 2 φ) estimated, the others at
    `prior`."""
    ids, weighted = parts[:, 0], parts[:, 1:]
    rest = [i for i in range(3) if i not in free]
    base = ids + weighted[:, rest] @ np.asarray(prior)[rest]
    x = np.column_stack([np.ones(len(y)), base, weighted[:, list(free)]])
    if len(y) < x.shape[1] + MIN_DOF:
        return None
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    xs = x / scale
    if np.linalg.matrix_rank(xs) < x.shape[1]:
        return None
    coef = nnls(xs, y) / scale
    if np.any(coef[1:] <= 0):
        return None
    resid = y - x @ coef
    sigma2 = float(resid @ resid) / (len(y) - x.shape[1])
    cov = sigma2 * np.linalg.inv(x.T @ x)
    if any(_ratio_se(coef, cov, i, 1) > MAX_REL_SE for i in range(2, x.shape[1])):
        return None
    weight = dict(zip(free, (float(c / coef[1]) for c in coef[2:]), strict=True))
    return UnitFit(
        float(coef[0]), float(coef[1]), weight.get(0), weight.get(1), len(y), weight.get(2)
    )
