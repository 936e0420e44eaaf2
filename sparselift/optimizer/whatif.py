"""What-if planning: two models, and only the choices both accept.

Planning for GPU hardware that no profile measured, every coefficient of SparseLift's cost model
is an assumption from a preset. TorchRec's EmbeddingPerfEstimator is another set of assumptions,
the one TorchRec's planner (the baseline) decides by. Where the two disagree on an option, an
option priced as nearly free by one can be dear in the other; so in this mode (CUDA, no
coefficient measured: `two_model_mode`) a plan must be no worse than TorchRec's under both:

* *One objective for both models.* The solver minimizes SparseLift's step plus `weight` ×
  TorchRec's verdict (`NoopPerfModel.rate`: the max over ranks of the summed per-shard
  estimates, `torchrec_prices`). The weight is SparseLift's seconds per TorchRec second, read
  from the two models' lower bounds of the same tables (`exchange_rate`): each model counts
  alike, neither one's units decide. It enters through the terms alone (`TwoModelCost`): TorchRec's
  estimate of a shard is added to the `dp_allreduce` phase of the rank holding it. That phase is
  otherwise the data-parallel allreduce, which every rank carries alike, so the phase's max over
  ranks is exactly the allreduce plus TorchRec's max over ranks, and the solver's Σ-over-phases
  objective is the sum of the two models' verdicts without any change to the solver.
* *Search.* CP-SAT solves it as it solves SparseLift's model alone; then a descent over whole
  decisions (`descent`) starts from the solved plan and from TorchRec's, and the better result
  is kept (`polish`): a max over ranks of one model's whole verdict is where the decomposed
  solve's average-rank relaxation is furthest from the placed plan.
* *Both verdicts, and the choices both accept.* The plan is then scored by both models against
  TorchRec's plan (the one TorchRec's estimator rates best of those given; at the plan's comm
  precision and as it runs, whichever each model rates lower). Where one model rates it worse,
  tables whose choices differ are set back to TorchRec's option one at a time, each time the
  one that brings the plan closest to what both accept (`agreement.both_accept`), until both
  rate it no worse; where no such mix is found, TorchRec's plan is kept. (`optimize` first
  solves once more with the rejecting model weighed more, and keeps the better of the two
  outcomes.) Both verdicts are printed.

Measured coefficients take precedence: with any coefficient from a profile, SparseLift's model
alone decides (`robust`). CPU topologies keep SparseLift's model too: TorchRec's estimator
describes GPU kernels and NVLink / network collectives, not gloo, and the cpu-gloo preset's lookup
and collective costs come from this project's CPU measurements (`sparselift.kernels`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from sparselift import plans
from sparselift.optimizer.coefficients import Coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import DDR_COL, HBM_COL, PHASES, Terms
from sparselift.optimizer.descent import descend
from sparselift.optimizer.problem import Problem, load_over_ranks
from sparselift.optimizer.space import Choice, OptionClass, PlanWide
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.torchrec_prices import TorchRecPrices

TORCHREC_WEIGHT = 1.0  # TorchRec's verdict against SparseLift's, in units of their lower bounds
NPH = len(PHASES)


def two_model_mode(topo: Topology, coeffs: Coefficients) -> bool:
    """Whether plans must also hold under TorchRec's estimator: a CUDA target and no coefficient
    measured (see the module)."""
    return topo.device == "cuda" and not coeffs.any_measured()


class PriceBook:
    """TorchRec's per-shard prices of one target, one `TorchRecPrices` per comm precision."""

    def __init__(self, stats: list[TableStats], topo: Topology, batch_size: int) -> None:
        self.stats, self.topo, self.batch_size = stats, topo, batch_size
        self._at: dict[tuple[str, str], TorchRecPrices] = {}

    def at(self, wide: PlanWide) -> TorchRecPrices:
        """The prices at `wide`'s comm precision (made on first use)."""
        key = (wide.forward, wide.backward)
        if key not in self._at:
            cp = plans.CommPrecision(forward=wide.forward, backward=wide.backward)
            self._at[key] = TorchRecPrices(self.stats, self.topo, self.batch_size, cp)
        return self._at[key]


class TwoModelCost(CostModel):
    """SparseLift's cost model whose terms also carry `weight` × TorchRec's estimate of each
    shard, in the `dp_allreduce` phase of the rank holding it (see the module): its step is
    SparseLift's step + weight × TorchRec's verdict; its memory is SparseLift's.

    Args:
        own: SparseLift's cost model of the target (its terms, counts and coefficients).
        book: TorchRec's prices of the same tables and target.
        weight: SparseLift seconds per TorchRec second (`exchange_rate`).
    """

    def __init__(self, own: CostModel, book: PriceBook, weight: float) -> None:
        super().__init__(own.topo, own.batch_size, own.coeffs)
        self.own, self.book, self.weight = own, book, weight
        self._two: dict[tuple[TableStats, OptionClass, str, str], Terms] = {}

    def terms(self, t: TableStats, c: OptionClass, plan_wide: PlanWide | None = None) -> Terms:
        """SparseLift's terms of table `t` under `c`, plus weight × TorchRec's estimate of its
        largest shard on every rank holding one (cached)."""
        wide = plan_wide or PlanWide()
        key = (t, c, wide.forward, wide.backward)
        hit = self._two.get(key)
        if hit is None:
            base = self.own.terms(t, c, wide)
            tr = self.weight * max(self.book.at(wide).shards(t.name, c), default=0.0)
            own = base.own._replace(dp_allreduce=base.own.dp_allreduce + tr)
            hit = self._two[key] = dataclasses.replace(base, own=own)
        return hit


def polish(
    p: Problem, solved: Mapping[str, Choice], torchrec: Mapping[str, Choice] | None
) -> dict[str, Choice]:
    """The better, under the problem's objective, of the solved choices and TorchRec's (where
    they fit the problem's memory), each first improved by `descent.descend`; ties: the solved.

    Why both: where the decomposed solve ends above TorchRec's plan, the descent from TorchRec's
    plan keeps what it got right and re-decides the rest.
    """
    starts = [dict(solved)]
    if torchrec is not None and _fits(p, torchrec):
        starts.append(dict(torchrec))
    best: tuple[float, dict[str, Choice]] | None = None
    for start in starts:
        out = descend(p, start)
        step = p.model.evaluate(p.by_name, out, p.plan_wide).step_time_s
        if best is None or step < best[0]:
            best = (step, out)
    assert best is not None
    return best[1]


def _fits(p: Problem, choices: Mapping[str, Choice]) -> bool:
    """Whether every rank's memory under `choices` is within the problem's caps."""
    loads = np.array(p.rank_loads(choices), dtype=float)
    hbm = p.hbm_cap if p.on_gpu else np.inf
    return bool((loads[:, HBM_COL] <= hbm).all() and (loads[:, DDR_COL] <= p.ddr_cap).all())


def exchange_rate(
    own: CostModel,
    prices: TorchRecPrices,
    stats: list[TableStats],
    classes: Mapping[str, list[OptionClass]],
    wide: PlanWide,
) -> float:
    """SparseLift seconds per TorchRec second: the ratio of the two models' lower bounds of a
    step (the dense step plus, per table, its cheapest class's load averaged over the ranks),
    times TORCHREC_WEIGHT; 0 when TorchRec charges nothing.

    Why lower bounds: they depend on the tables and the target alone, not on a plan that one
    of the two models already prefers, so neither model's view sets the exchange rate.
    """
    W, L = own.topo.world_size, own.topo.local_world_size
    ours, theirs = own.coeffs.dense_step_s, 0.0
    prices.price((s.name, c) for s in stats for c in classes[s.name])
    for s in stats:
        cs = classes[s.name]
        ours += min(sum(load_over_ranks(own.terms(s, c, wide), c, W, L)[:NPH]) for c in cs) / W
        theirs += min(sum(prices.shards(s.name, c)) for c in cs) / W
    return TORCHREC_WEIGHT * ours / theirs if theirs > 0 else 0.0
