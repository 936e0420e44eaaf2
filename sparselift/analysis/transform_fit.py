"""The batch transform's cost fitted from the timings profiles recorded: `ops["batch_transform"]`.

A plan with splits runs `sparselift.plans.transform.BatchTransform` on every rank's batch each
step. The profiler times it on a real batch of the profiled run (`sparselift.profiler.
transform_cost`): each sample is one set of tables split, with the split features it routes, the
ids it routes and its seconds over the same batch transformed without splits. The optimizer
prices the transform as a_s per split feature plus b_s per id routed (per rank and step), so
the fit is seconds ≈ a_s · features + b_s · ids, least squares without an intercept (the
baseline was taken out), both coefficients ≥ 0.

Pure numpy: the analysis and the profiler both call it, and neither needs torch for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparselift.calibration import TRANSFORM_UNIT, OpFit
from sparselift.errors import UserError

TRANSFORM = "batch_transform"  # the op kind in calibration.json and the manifest's key


@dataclass(frozen=True)
class TransformSample:
    """One timed transform: `features` split features routing `ids` ids took `seconds` more
    than the same batch without splits."""

    features: int
    ids: int
    seconds: float


def fit_transform(samples: Sequence[TransformSample]) -> OpFit | None:
    """seconds ≈ a_s · features + b_s · ids over `samples`, both ≥ 0.

    Non-negative least squares on two variables: the unconstrained solution where both are
    ≥ 0, else the better of the two one-variable fits (each clipped at 0). Samples that are
    all alike in (features, ids) still fit: the solution of least norm.

    Args:
        samples: the timings (any number; seconds may be negative from noise).
    Returns:
        The OpFit (x = "ids", a_s per split feature, b_s per id, r2 against the samples' mean,
        n = samples), or None without a sample that routes a feature.
    """
    rows = [s for s in samples if s.features > 0]
    if not rows:
        return None
    x = np.array([[s.features, s.ids] for s in rows], dtype=float)
    y = np.array([s.seconds for s in rows], dtype=float)
    coef = _nnls2(x, y)
    predicted = x @ coef
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = float(1 - ((y - predicted) ** 2).sum() / spread) if spread > 0 else 1.0
    return OpFit(
        x=TRANSFORM_UNIT, a_s=float(coef[0]), b_s=float(coef[1]), r2=r2, n=len(rows), calls=1.0
    )


def _nnls2(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin ‖x·c − y‖ over c ≥ 0, for x of two columns."""
    c, *_ = np.linalg.lstsq(x, y, rcond=None)
    if (c >= 0).all():
        return c
    best, best_err = np.zeros(2), float((y**2).sum())
    for j in range(2):
        col = x[:, j]
        denom = float(col @ col)
        if denom <= 0:
            continue
        cj = np.zeros(2)
        cj[j] = max(0.0, float(col @ y) / denom)
        err = float(((x @ cj - y) ** 2).sum())
        if err < best_err:
            best, best_err = cj, err
    return best


def samples_of(manifest: Mapping[str, Any], where: str) -> list[TransformSample]:
    """The transform timings a profile manifest records (its `batch_transform.samples`).

    Args:
        manifest: the profile's manifest.json object.
        where: what to name in messages (the manifest's path).
    Returns:
        The samples; [] where the manifest has no record (an older profile, or the timing
        failed).
    Raises:
        UserError: the record is there but malformed; the message names `where` and the
            sample.
    """
    rows = recorded_samples(manifest, TRANSFORM, ("features", "ids"), ("seconds",), where)
    return [TransformSample(int(r["features"]), int(r["ids"]), float(r["seconds"])) for r in rows]


def recorded_samples(
    manifest: Mapping[str, Any],
    key: str,
    counts: tuple[str, ...],
    numbers: tuple[str, ...],
    where: str,
) -> list[Mapping[str, Any]]:
    """The samples a profile manifest records under `key` (its `key.samples`), checked.

    Args:
        manifest: the profile's manifest.json object.
        key: the record ("batch_transform", "recombine").
        counts: the fields each sample needs as finite numbers >= 0.
        numbers: the fields it needs as finite numbers (a time less a baseline may be < 0).
        where: what to name in messages (the manifest's path).
    Returns:
        The samples as recorded; [] where the manifest has no such record.
    Raises:
        UserError: the record is there but malformed; the message names `where` and the sample.
    """
    rec = manifest.get(key)
    if rec is None:
        return []
    if not isinstance(rec, Mapping) or not isinstance(rec.get("samples"), list):
        raise UserError(f"{where}: {key} must be an object with a list of samples")
    for i, s in enumerate(rec["samples"]):
        ok = isinstance(s, Mapping) and all(_is_number(s.get(k)) for k in (*counts, *numbers))
        if not ok or any(s[k] < 0 for k in counts):
            *first, last = [*(f"{k} >= 0" for k in counts), *numbers]
            raise UserError(f"{where}: {key}.samples[{i}] needs {', '.join(first)} and {last}")
    return list(rec["samples"])


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
