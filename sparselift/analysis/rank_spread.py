"""How far each rank's lookups stray from the fitted lines: the calibration's `lookup_rank_spread`.

The lookup lines are fitted on every rank and table at once, so each rank's predicted lookups err
a little: a rank holds tables whose rows cost more or less than the line says, and its threads
run on a core of their own speed. A plan balanced on predicted costs is balanced on these errors
too, and its slowest rank ends later than predicted (`sparselift.spread`). The spread is
measured within each profile, about the profile's own level (a job that ran fast or slow moves
every rank alike, and no plan's balance changes that), and pooled over profiles.

Tables that every rank looks up alike (data-parallel and row-wise groups) err alike on every
rank: their part of a rank's lookups is *shared* and carries no spread; the spread is per unit of
a rank's own part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from sparselift.analysis.dense_backward import with_dense_scale
from sparselift.analysis.samples import LOOKUPS, lookup_work_of, n_calls_of
from sparselift.calibration import DENSE_KERNEL_TYPE, REDUCE_SCATTER_TYPES, OpFit, lookup_unit
from sparselift.kernels import KERNEL_UNIT
from sparselift.spread import premium_s

SHARED_GROUPS = (DENSE_KERNEL_TYPE, *REDUCE_SCATTER_TYPES)  # every rank looks them up alike
MIN_DOF = 2  # ranks beyond one per profile, pooled, for the spread to be measured


def in_fitted_unit(calls: pd.DataFrame, ops: Mapping[str, OpFit], device: str) -> pd.DataFrame:
    """`calls` with the lookups' work recounted in the unit `ops` were fitted in (`lookup_unit`,
    on CPU) and the data-parallel groups' backward work scaled by lookup_bwd's `dense_scale`."""
    unit = lookup_unit(ops)
    if unit != KERNEL_UNIT and device == "cpu":
        look = calls["kind"].isin(LOOKUPS)
        calls = calls.copy()
        calls.loc[look, "x"] = lookup_work_of(calls[look], calls.loc[look, "kind"], device, unit)
    bwd = ops.get("lookup_bwd")
    return with_dense_scale(calls, bwd.dense_scale if bwd is not None else None)


def lookups_by_rank(calls: pd.DataFrame, ops: Mapping[str, OpFit], device: str) -> pd.DataFrame:
    """Each rank's lookups per step, measured and predicted by `ops` (medians over steps).

    Args:
        calls: one profile's per-call samples (`samples.call_samples`).
        ops: fits that include lookup_fwd and lookup_bwd (a kind without a fit is left out).
        device: the profiled device.
    Returns:
        Indexed by rank: `measured_s`, `predicted_s` and `shared_s` (the predicted part in
        SHARED_GROUPS); empty without lookup calls.
    """
    look = calls[calls["kind"].isin([k for k in LOOKUPS if k in ops])]
    cols = ["measured_s", "predicted_s", "shared_s"]
    if look.empty:
        return pd.DataFrame(columns=cols, dtype=float)
    shared = look["group"].isin(SHARED_GROUPS) if "group" in look else False
    look = in_fitted_unit(look, ops, device).assign(n=n_calls_of(look), shared=shared)
    per = (
        look.groupby(["rank", "step", "kind", "shared"])
        .agg(x=("x", "sum"), n=("n", "sum"), measured_s=("y", "sum"))
        .reset_index()
    )
    per["predicted_s"] = [
        ops[k].cost(x, n) for k, x, n in zip(per["kind"], per["x"], per["n"], strict=True)
    ]
    per["shared_s"] = per["predicted_s"].where(per["shared"], 0.0)
    return per.groupby(["rank", "step"])[cols].sum().groupby(level="rank")[cols].median()


def lookup_rank_spread(per_profile: Sequence[pd.DataFrame]) -> float | None:
    """The relative standard error of a rank's own predicted lookups, pooled over profiles.

    Per profile, each rank's log(measured ÷ predicted) is taken about the profile's mean and
    scaled to the rank's own part (predicted ÷ (predicted − shared)); the squares are pooled
    with one degree of freedom per rank beyond the first in each profile.

    Args:
        per_profile: `lookups_by_rank` of each profile.
    Returns:
        The spread (a share, ≥ 0); None with fewer than MIN_DOF degrees of freedom (one profile
        of two ranks does not measure it).
    """
    squares, dof = 0.0, 0
    for ranks in per_profile:
        own = ranks["predicted_s"] - ranks["shared_s"]
        ok = (ranks["measured_s"] > 0) & (ranks["predicted_s"] > 0) & (own > 0)
        r = ranks[ok]
        if len(r) < 2:
            continue
        dev = np.log(r["measured_s"] / r["predicted_s"])
        scaled = (dev - dev.mean()) * r["predicted_s"] / own[ok]
        squares += float((scaled**2).sum())
        dof += len(r) - 1
    return float(np.sqrt(squares / dof)) if dof >= MIN_DOF else None


def rank_premium_s(ranks: pd.DataFrame, spread: float | None) -> float:
    """How much later than its largest predicted rank a profile's lookups end on average,
    at `spread` (`sparselift.spread.premium_s`); 0.0 without a spread or without lookups."""
    if not spread or ranks.empty:
        return 0.0
    own = (ranks["predicted_s"] - ranks["shared_s"]).clip(lower=0.0)
    return premium_s(list(ranks["predicted_s"]), list(spread * own))
