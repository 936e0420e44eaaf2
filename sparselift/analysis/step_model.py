"""What the fitted model says a profile's step is: its sparse path and its dense residual.

The calibration's fits price a profile's own calls as the optimizer's cost model prices a plan
(`sparse_cost`): per op kind the per-call and per-unit costs of the groups present, on the slowest
rank. The step a profile reproduces (`sparse_at_target`) adds its data-parallel tables'
all-reduce and optimizer pass and the slowest rank's expected lateness; what is left of the
measured step is the dense part (`dense_of`), the same model in every plan (`dense_fit`).
Row-wise and table-row-wise output distributions (a reduce-scatter) are their own kinds
(`with_rs_kinds`), priced like the all-to-all's where no profile ran them (`fit_of`).
"""

from __future__ import annotations

import pandas as pd

from sparselift.analysis.dense_backward import tables_allreduce_s, tables_optimizer_s
from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.rank_spread import in_fitted_unit, lookups_by_rank, rank_premium_s
from sparselift.analysis.samples import n_calls_of
from sparselift.analysis.type_overhead import DenseFit, fit_dense, model_parallel_types
from sparselift.calibration import A2A_KIND, REDUCE_SCATTER_TYPES, RS_KIND, OpFit


def with_rs_kinds(calls: pd.DataFrame) -> pd.DataFrame:
    """`calls` with the output distributions of reduce-scatter groups (row-wise, table-row-wise)
    relabelled as their own kinds (`calibration.RS_KIND`); idempotent.

    Args:
        calls: per-call samples (`kind`, `group` columns).
    Returns:
        `calls` itself when it has no such call, else a relabelled copy.
    """
    rs = calls["kind"].isin(list(RS_KIND)) & calls["group"].isin(REDUCE_SCATTER_TYPES)
    if not rs.any():
        return calls
    out = calls.copy()
    out.loc[rs, "kind"] = out.loc[rs, "kind"].map(RS_KIND)
    return out


def fit_of(ops: dict[str, OpFit], kind: str) -> OpFit | None:
    """The fit that prices `kind`: its own, or for a reduce-scatter kind no profile fitted, the
    all-to-all's of its direction (by analogy, as the optimizer prices it); None without one."""
    fit = ops.get(kind)
    return fit if fit is not None or kind not in A2A_KIND else ops.get(A2A_KIND[kind])


def sparse_cost(calls: pd.DataFrame, ops: dict[str, OpFit], device: str = "cpu") -> pd.Series:
    """Modelled sparse-path seconds per step, composed as the optimizer's cost model does.

    Per kind: the per-call costs of the groups present plus the per-unit work, on the slowest rank.
    Lookup work is recounted in the unit `ops` were fitted in (`lookup_unit`), and data-parallel
    groups' backward work scaled by lookup_bwd's `dense_scale`. Reduce-scatter
    output distributions are priced as their own kinds (`with_rs_kinds`, `fit_of`).

    Args:
        calls: per-call samples of one profile.
        ops: the fits of every kind in `calls` (a reduce-scatter kind may be missing where its
            all-to-all kind is there).
        device: the profiled device (the lookup unit differs).
    Returns:
        Seconds, indexed by step.
    """
    calls = in_fitted_unit(with_rs_kinds(calls), ops, device)
    per = (
        calls.assign(n_calls=n_calls_of(calls))
        .groupby(["step", "kind", "rank"])
        .agg(x=("x", "sum"), n=("n_calls", "sum"))
        .reset_index()
    )
    fits = {k: f for k in per["kind"].unique() if (f := fit_of(ops, k)) is not None}
    per["cost"] = [
        fits[k].cost(x, n) for k, x, n in zip(per["kind"], per["x"], per["n"], strict=True)
    ]
    return per.groupby(["step", "kind"])["cost"].max().groupby("step").sum()


def sparse_at_target(
    ev: ProfileEvidence, ops: dict[str, OpFit], spread: float | None = None
) -> float:
    """The profile's modelled sparse path at the step its calibration reproduces (`target_s`):
    at its fastest step, or over its quieter steps (median) when steady steps were timed; with
    its data-parallel tables' gradient all-reduce and optimizer pass as the optimizer prices
    them (`dense_backward.tables_allreduce_s`, `tables_optimizer_s`), and, at a rank spread
    `spread`, how much later its slowest rank's lookups end on average
    (`rank_spread.rank_premium_s`), as the optimizer prices a plan."""
    calls = with_rs_kinds(ev.calls)
    priced = [k for k in calls["kind"].unique() if fit_of(ops, k) is not None]
    calls = calls[calls["kind"].isin(priced)]
    sparse = sparse_cost(calls, ops, ev.device).reindex(ev.step_s.index).fillna(0.0)
    beside = tables_allreduce_s(ev.manifest, ops) + tables_optimizer_s(ev.manifest, ops)
    beside += rank_premium_s(lookups_by_rank(ev.calls, ops, ev.device), spread)
    if ev.steady_step_s is None:
        return float(sparse.at[ev.step_s.idxmin()]) + beside
    return float(sparse.loc[sorted(ev.calls["step"].unique())].median()) + beside


def dense_of(ev: ProfileEvidence, ops: dict[str, OpFit], spread: float | None = None) -> float:
    """The profile's dense step under `ops` and the rank spread `spread`: the step it
    reproduces less the modelled sparse path there (never negative)."""
    return max(ev.target_s - sparse_at_target(ev, ops, spread), 0.0)


def dense_fit(
    evidence: list[ProfileEvidence], ops: list[dict[str, OpFit]], spread: float | None = None
) -> DenseFit:
    """The dense step and the per-type overhead (`type_overhead.fit_dense`) from each
    profile's residual under its own fits (`ops[i]` prices `evidence[i]`) and `spread`."""
    return fit_dense(
        [dense_of(ev, o, spread) for ev, o in zip(evidence, ops, strict=True)],
        [model_parallel_types(ev.manifest) for ev in evidence],
    )
