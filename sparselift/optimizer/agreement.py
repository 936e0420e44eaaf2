"""Both models' verdicts on a plan against TorchRec's, and the choices both accept.

What-if planning (`whatif`) ships a plan only where SparseLift's model and TorchRec's estimator
both rate it no worse than TorchRec's plan. `both_accept` checks the solved plan; where one model
rejects it, it sets tables back to TorchRec's option one at a time (`_set_back`), each time the
one that brings the plan closest to what both accept, and keeps TorchRec's plan where no mix of
the two is accepted. Each candidate is priced from per-rank load arrays in O(ranks), so a step
tries every table at once; the result is a function of the inputs (fixed orders, the first of
equals). A 16-bit comm precision that no profile of the hardware measured is taken only where both
models rate it faster than fp32 (`torchrec_agrees`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparselift.optimizer.cost_model import CostModel, Group, group_of, sum_rank_loads
from sparselift.optimizer.costs import DDR_COL, HBM_COL, PHASES
from sparselift.optimizer.space import Choice, PlanWide
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.torchrec_prices import TorchRecPrices
from sparselift.optimizer.torchrec_storage import hbm_budget
from sparselift.optimizer.whatif import PriceBook

NPH = len(PHASES)


@dataclass(frozen=True)
class Verdicts:
    """Both models on a plan and on TorchRec's plan (seconds): SparseLift's predicted step and
    TorchRec's estimator's verdict (`NoopPerfModel.rate`)."""

    ours_sparselift_s: float
    ours_torchrec_s: float
    base_sparselift_s: float
    base_torchrec_s: float

    @property
    def accepted(self) -> bool:
        """Whether both models rate the plan no worse than TorchRec's."""
        return self.rejected_by is None

    @property
    def rejected_by(self) -> str | None:
        """ "torchrec" or "sparselift": the model that rates the plan worse than TorchRec's (the
        one that does so by the larger share, if both), or None."""
        sl = self.ours_sparselift_s / self.base_sparselift_s
        tr = self.ours_torchrec_s / self.base_torchrec_s
        if max(sl, tr) <= 1.0:
            return None
        return "torchrec" if tr >= sl else "sparselift"

    @property
    def worst_gain(self) -> float:
        """TorchRec's plan ÷ the plan under the model that rates the plan's gain lowest."""
        return min(
            self.base_sparselift_s / self.ours_sparselift_s,
            self.base_torchrec_s / self.ours_torchrec_s,
        )

    def line(self, label: str) -> str:
        """One line with both verdicts on plan `label` against TorchRec's plan (ms, speedup)."""

        def one(name: str, ours: float, base: float) -> str:
            return f"{name} {ours * 1e3:.3f} vs {base * 1e3:.3f} ms ({base / ours:.3f}×)"

        return (
            f"{label} vs TorchRec's plan: "
            + one("SparseLift's model", self.ours_sparselift_s, self.base_sparselift_s)
            + "; "
            + one("TorchRec's estimator", self.ours_torchrec_s, self.base_torchrec_s)
        )


@dataclass
class Agreement:
    """What `both_accept` ships.

    Attributes:
        choices: every table's choice.
        plan_wide: their precision (TorchRec's plan's own where it is kept).
        verdicts: both models on them and on TorchRec's plan.
        solved: both models on the plan as solved.
        kept: the choices are TorchRec's (no mix of the two is rated no worse by both, or the
            solve found nothing better); `plan_wide` says at which precision.
        notes: lines for the caller to print (empty where both accept the plan as solved).
    """

    choices: dict[str, Choice]
    plan_wide: PlanWide
    verdicts: Verdicts
    solved: Verdicts
    kept: bool
    notes: list[str]


def both_accept(
    own: CostModel,
    book: PriceBook,
    stats: list[TableStats],
    solved: Mapping[str, Choice],
    base: Mapping[str, Choice],
    wide: PlanWide,
    base_wide: PlanWide,
    objective: CostModel | None = None,
) -> Agreement:
    """The choices both models rate no worse than TorchRec's: the solved ones, or those with a
    few tables set back to TorchRec's option, or TorchRec's choices.

    TorchRec's plan is judged at `wide` (the plan's precision) and as it runs (`base_wide`), each
    model taking the lower of the two. The start is the solved plan, or TorchRec's choices at
    `wide` where the solve's `objective` rates those lower (a time-limited or decomposed solve can
    end above its warm start). While one model rates the plan worse, every table whose choice
    differs is tried at TorchRec's option (`_set_back`: its class, at TorchRec's placement or
    where it suits both models best now), and the one that lowers the larger of the two ratios
    (the plan's ÷ TorchRec's, per model) most is kept (ties: the plan's table order), as long as
    every rank's memory still fits; where no switch lowers it, TorchRec's choices are returned,
    at `wide` where both models rate them no worse there, else at `base_wide`. Deterministic: a
    function of the inputs.

    Args:
        own: SparseLift's cost model.
        book: TorchRec's prices.
        stats: the tables, in the plan's order.
        solved: the solved choices (at `wide`; pipeline base).
        base: TorchRec's plan's choices.
        wide, base_wide: the plan's and TorchRec's plan's precision (pipeline base).
        objective: the cost model the solve minimized (default `own`).
    Returns:
        The choices shipped, both models' verdicts on them and on the solved plan, and what was
        set back and why.
    """
    by_name = {s.name: s for s in stats}
    sl_ref = min(own.evaluate(by_name, base, w).step_time_s for w in (wide, base_wide))
    tr_ref = min(book.at(w).rate_s(base) for w in (wide, base_wide))

    def verdicts(ch: Mapping[str, Choice], w: PlanWide) -> Verdicts:
        sl = own.evaluate(by_name, ch, w).step_time_s
        return Verdicts(sl, book.at(w).rate_s(ch), sl_ref, tr_ref)

    first = verdicts(solved, wide)
    objective = objective or own
    ours: Mapping[str, Choice] = solved
    notes = [] if first.accepted else [first.line("SparseLift's plan as solved")]
    if objective.evaluate(by_name, base, wide).step_time_s < (
        objective.evaluate(by_name, solved, wide).step_time_s
    ):
        ours = base
        notes.append("the solve ended above its start, TorchRec's plan: that is the start")
    base_at_wide = verdicts(base, wide)
    start = first if ours is solved else base_at_wide
    if start.accepted:
        return Agreement(dict(ours), wide, start, first, dict(ours) == dict(base), notes)
    back = _set_back(own, book.at(wide), stats, ours, base, wide, (sl_ref, tr_ref))
    if back is None:
        w = wide if base_at_wide.accepted else base_wide
        notes.append(
            "kept TorchRec's plan: no mix of the two plans' choices is rated no worse by both "
            f"models (at {w.forward}/{w.backward})"
        )
        kept = base_at_wide if w is wide else verdicts(base, w)
        return Agreement(dict(base), w, kept, first, True, notes)
    out = {n: back.get(n, ours[n]) for n in ours}
    named = list(back)
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more" if len(named) > 5 else "")
    notes.append(
        f"{len(back)} table(s) set back to TorchRec's option, where the models disagree: {shown}"
    )
    return Agreement(out, wide, verdicts(out, wide), first, out == dict(base), notes)


def _set_back(
    own: CostModel,
    prices: TorchRecPrices,
    stats: list[TableStats],
    ours: Mapping[str, Choice],
    base: Mapping[str, Choice],
    wide: PlanWide,
    refs: tuple[float, float],
) -> dict[str, Choice] | None:
    """The tables `both_accept` sets back to TorchRec's option, with where their shards go, or
    None where no mix is rated no worse by both models (see there).

    A table set back takes TorchRec's class at TorchRec's placement, or, where the class puts
    shards on chosen ranks or a host, at the placement that suits both models best now (each
    shard where the larger of the two ratios grows least; the first rank of equals): TorchRec's
    ranks were chosen around TorchRec's other tables, not the plan's. Every rank's load is kept
    as arrays, and each candidate is priced from them in O(ranks).
    """
    by_name = {s.name: s for s in stats}
    topo = own.topo
    names = [s.name for s in stats if ours[s.name] != base[s.name]]
    if not names:
        return None

    def loads(ch: Mapping[str, Choice]) -> np.ndarray:
        placed = ((c, own.terms(by_name[n], c.cls, wide)) for n, c in ch.items())
        return np.array(sum_rank_loads(topo, placed), dtype=float)

    def tr_loads(name: str, ch: Choice) -> np.ndarray:
        out = np.zeros(topo.world_size)
        np.add.at(out, ch.plan_ranks(topo), prices.shards(name, ch.cls))
        return out

    load, tr = loads(ours), np.array(prices.rank_totals(ours))
    load_a = {n: loads({n: ours[n]}) for n in names}
    tr_a = {n: tr_loads(n, ours[n]) for n in names}
    group = {n: group_of(by_name[n], ch.cls) for n, ch in ours.items()}
    hbm = hbm_budget(topo, own.batch_size, stats) if topo.device == "cuda" else np.inf
    caps = np.array([hbm, topo.usable(topo.ddr_bytes)], dtype=float)
    fixed_now = float(sum(own.fixed_call_costs(group.values())))
    current = _worse_ratio(own.coeffs.dense_step_s + fixed_now, load, tr, refs)
    left, back = list(names), {}
    while current > 1.0 and left:
        counts = Counter(group.values())
        best: tuple[float, str, Choice, np.ndarray, np.ndarray] | None = None
        for name in left:  # the plan's table order: the first of equals
            to = base[name]
            fixed = _fixed_after(own, counts, group[name], group_of(by_name[name], to.cls))
            lift = own.coeffs.dense_step_s + fixed
            rest, rest_tr = load - load_a[name], tr - tr_a[name]
            terms = own.terms(by_name[name], to.cls, wide)
            cands = [(to, rest + loads({name: to}), rest_tr + tr_loads(name, to))]
            if to.cls.located == "rank" and not any(terms.remote_intra + terms.remote_inter):
                shard_tr = prices.shards(name, to.cls)
                placed = _place_both(rest, rest_tr, np.array(terms.own), shard_tr, caps, lift, refs)
                if placed is not None:
                    ranks, sl_l, tr_l = placed
                    cands.append((Choice(to.cls, ranks=ranks), sl_l, tr_l))
            for ch, sl_l, tr_l in cands:
                if (sl_l[:, [HBM_COL, DDR_COL]] > caps).any():
                    continue
                r = _worse_ratio(lift, sl_l, tr_l, refs)
                if best is None or r < best[0]:
                    best = (r, name, ch, sl_l, tr_l)
        if best is None or not best[0] < current:
            return None
        current, name, ch, load, tr = best
        left.remove(name)
        group[name] = group_of(by_name[name], ch.cls)
        back[name] = ch
    return back if current <= 1.0 else None


def _worse_ratio(lift: float, load: np.ndarray, tr: np.ndarray, refs: tuple[float, float]) -> float:
    """The larger of the two models' ratios to TorchRec's plan (`refs`) for per-rank loads:
    SparseLift's step (`lift`, its constant part, plus each phase's busiest rank) and TorchRec's
    busiest rank."""
    return float(max((lift + load[:, :NPH].max(axis=0).sum()) / refs[0], tr.max() / refs[1]))


def _place_both(
    rest: np.ndarray,
    rest_tr: np.ndarray,
    own: np.ndarray,
    shard_tr: tuple[float, ...],
    caps: np.ndarray,
    lift: float,
    refs: tuple[float, float],
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray] | None:
    """Shards whose load is their rank's alone (SparseLift's `own` each, TorchRec's `shard_tr`),
    on distinct ranks one at a time, each where max(SparseLift ÷ ref, TorchRec ÷ ref) is least
    (`lift`: the step's constant part): (ranks, both loads) or None where memory is short."""
    sl, t, ranks = rest.copy(), rest_tr.copy(), list[int]()
    cols = np.arange(NPH)
    for x in shard_tr:
        ph = sl[:, :NPH]
        top = np.argsort(-ph, axis=0, kind="stable")[:2]
        second = ph[top[1], cols] if len(ph) > 1 else np.zeros(NPH)
        rows = np.arange(len(ph))[:, None]
        others = np.where(rows == top[0][None, :], second[None, :], ph[top[0], cols][None, :])
        step = lift + np.maximum(others, ph + own[None, :NPH]).sum(axis=1)
        order = np.argsort(-t, kind="stable")
        t_others = np.where(
            np.arange(len(t)) == order[0], t[order[1]] if len(t) > 1 else 0, t[order[0]]
        )
        r = np.maximum(step / refs[0], np.maximum(t_others, t + x) / refs[1])
        over = ((sl[:, [HBM_COL, DDR_COL]] + own[[HBM_COL, DDR_COL]]) > caps).any(axis=1)
        r[over] = np.inf
        r[ranks] = np.inf
        q = int(np.argmin(r))
        if not np.isfinite(r[q]):
            return None
        ranks.append(q)
        sl[q] += own
        t[q] += x
    return tuple(sorted(ranks)), sl, t


def _fixed_after(own: CostModel, counts: Counter[Group], frm: Group, to: Group) -> float:
    """The plan's fixed per-call costs (seconds) once one table moves from group `frm` to `to`
    (`counts`: tables per group now)."""
    after = counts.copy()
    after[frm] -= 1
    after[to] += 1
    return float(sum(own.fixed_call_costs(g for g, k in after.items() if k > 0)))


def verdicts_alone(
    model: CostModel,
    book: PriceBook,
    by_name: Mapping[str, TableStats],
    choices: Mapping[str, Choice],
    wide: PlanWide,
) -> str:
    """Both models' verdicts on a plan that has no TorchRec plan to compare with."""
    sl = model.evaluate(by_name, choices, wide).step_time_s
    tr = book.at(wide).rate_s(choices)
    return (
        f"the plan (no TorchRec plan to compare with): SparseLift's model {sl * 1e3:.3f} ms; "
        f"TorchRec's estimator {tr * 1e3:.3f} ms"
    )


def torchrec_agrees(
    inp: Any,
    model: CostModel,
    choices: Mapping[str, Choice],
    wide: PlanWide,
    pipeline: str,
    book: PriceBook | None = None,
    tables: Mapping[str, TableStats] | None = None,
) -> tuple[bool, str]:
    """Whether both SparseLift's model and TorchRec's estimator rate `choices` faster at the
    16-bit precision `wide` than at fp32 (same shards, same pipeline), and a line with both
    verdicts. A plan TorchRec's estimator cannot rate counts as not accepted.

    Args:
        inp: the `optimize.Inputs` (tables, topology, batch size).
        model: SparseLift's cost model.
        choices: the plan solved at `wide`.
        wide: the 16-bit precision.
        pipeline: the plan's pipeline.
        book: TorchRec's prices of these inputs (made here when None).
        tables: the tables `choices` runs by name (split parts too); default the inputs'.
            TorchRec's estimator cannot rate split parts: such a plan is not accepted.
    """
    half = PlanWide(wide.forward, wide.backward, pipeline)
    full = PlanWide("fp32", "fp32", pipeline)
    by_name = tables if tables is not None else {s.name: s for s in inp.stats}
    ours = [model.evaluate(by_name, choices, w).step_time_s * 1e3 for w in (half, full)]
    label = f"{wide.forward}/{wide.backward}"
    verdict = f"SparseLift's model {ours[0]:.3f} vs {ours[1]:.3f} ms"
    book = book or PriceBook(inp.stats, inp.topo, inp.batch_size)
    try:
        r16, r32 = (book.at(w).rate_s(choices) * 1e3 for w in (half, full))
    except Exception as e:  # any failure of TorchRec's estimator counts as "no"
        theirs, agreed = f"TorchRec's estimator could not rate it ({e})", False
    else:
        theirs = f"TorchRec's estimator {r16:.3f} vs {r32:.3f} ms"
        agreed = ours[0] < ours[1] and r16 < r32
    chosen = label if agreed else f"fp32 rather than {label}"
    return agreed, (
        f"comm precision {chosen} (no profile of this hardware; {label} vs fp32): "
        f"{verdict}; {theirs}"
    )
