"""One planning run: inputs → feasible options → plan-wide choices → CP-SAT → plan, never worse
than TorchRec's under our model, with its predicted costs, the solver's record and the evidence
of every coefficient it was priced with.

Options that only evidence can justify are gated (`robust`): UVM caching only where memory
forces it, the sparse-dist pipeline only where measured faster, 16-bit collectives only with
measured costs or, for unprofiled hardware, TorchRec's estimator's agreement. Splits of tables
into virtual tables (`Inputs.splits`) are offered only where SparseLift's model alone decides:
what-if plans that must also hold under TorchRec's estimator get none, as it cannot price them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparselift import plans
from sparselift.errors import UserError
from sparselift.optimizer.agreement import (
    Agreement,
    Verdicts,
    both_accept,
    torchrec_agrees,
    verdicts_alone,
)
from sparselift.optimizer.choose import CheapestBaseline, PendingBaselines, choose_precision
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PlanCost
from sparselift.optimizer.feasibility import fits_memory
from sparselift.optimizer.inputs import Inputs
from sparselift.optimizer.planio import choices_from_plan, to_plan
from sparselift.optimizer.problem import Problem, Solution
from sparselift.optimizer.readout import Decided, read_out
from sparselift.optimizer.robust import (
    gate_precision,
    kept_wide,
    margin_for_splits,
    pipeline_measured,
    pipeline_pays,
    solve_without_dominated,
)
from sparselift.optimizer.space import Choice, OptionClass, PlanWide
from sparselift.optimizer.split_options import (
    SplitOption,
    chosen_splits,
    part_stats,
    plan_tables,
)
from sparselift.optimizer.torchrec_storage import hbm_budget
from sparselift.optimizer.whatif import (
    PriceBook,
    TwoModelCost,
    exchange_rate,
    polish,
    two_model_mode,
)

TILT = 4.0  # what-if: the factor on the weight of the model that rejected the first solve
RETRY_SHARE = 0.5  # … and that second solve's share of the time limit
# With splits on offer: the share of the time limit the solve without them gets, before the solve
# with them starts from its plan (the larger model alone can end worse within its limit).
PLAIN_SHARE = 0.4


@dataclass
class Result:
    """A planning run's outcome.

    Attributes:
        plan: the plan to write (SparseLift's, or the baseline kept).
        cost: its predicted cost.
        solution: the solver's answer and record.
        baseline: the cheapest TorchRec plan given, or None.
        baseline_cost: its predicted cost, or None.
        kept_baseline: the baseline was kept (ours not predicted faster by `min_gain`).
        notes: one line per evidence check that decided an option (the comm precision's
            verdicts; what-if: both models' verdicts), for the caller to print.
        verdicts: what-if planning with a TorchRec plan given (`whatif`): both models on the
            plan shipped and on TorchRec's plan; else None.
    """

    plan: plans.Plan
    cost: PlanCost
    solution: Solution
    baseline: plans.Plan | None
    baseline_cost: PlanCost | None
    kept_baseline: bool
    notes: list[str] = field(default_factory=list)
    verdicts: Verdicts | None = None


def optimize(
    inp: Inputs,
    *,
    time_limit_s: float = 30.0,
    seed: int = 0,
    workers: int = 1,
    mode: str = "auto",
    baseline: plans.Plan | None = None,
    progress: Callable[[str], None] | None = None,
    min_gain: float = 0.0,
    other_baselines: tuple[plans.Plan, ...] = (),
    pending_baselines: PendingBaselines | None = None,
    current: plans.Plan | None = None,
    two_models: bool | None = None,
    split_margin: float | None = None,
) -> Result:
    """Plan: solve, then keep the cheapest baseline unless ours is predicted faster by `min_gain`.

    The comm precision is the cost model's (`choose_precision`) where evidence allows it
    (`robust.gate_precision`); planning for unprofiled hardware at 16 bits, TorchRec's estimator
    is asked after the solve, and where it does not also rate the plan faster at 16 bits, the
    plan is solved again at fp32. The verdicts are in `Result.notes`.

    What-if planning for GPUs (`whatif.two_model_mode`: no coefficient measured) minimizes
    SparseLift's step plus TorchRec's estimator's verdict, and ships only choices both models rate
    no worse than TorchRec's best plan given (`whatif.both_accept`); where the solved plan is
    rejected by one model, it is solved once more (RETRY_SHARE of the time limit) with that
    model weighed TILT× more, and the outcome better by the model that gains less is kept. Both
    models' verdicts are in `Result.notes` and `Result.verdicts`.

    Args:
        inp: what to plan for.
        time_limit_s, seed, workers, mode, progress: the solver's (`solver.solve`).
        baseline: a TorchRec plan to start from and to beat.
        min_gain: the share by which a new plan must beat the baseline under the model to be
            worth the change: below the model's own prediction error, a "better" plan is a coin
            toss.
        other_baselines: more plans to beat (the cheapest of all is the warm start).
        pending_baselines: plans still being made, waited for once the first CP-SAT model is
            built (after `baseline` and `other_baselines` in the order of ties).
        current: the plan the profiled job runs today: kept (as it is) unless the new plan is
            predicted `min_gain` faster than it, whichever baseline that new plan is; where a
            baseline kept over ours is not, but ours is, ours.
        two_models: whether the plan must also hold under TorchRec's estimator; None: where
            `whatif.two_model_mode` says (benchmarks of SparseLift's model alone pass False).
        split_margin: the share by which a plan with splits must be predicted faster than the
            best plan without; None: the calibration's largest leave-one-out error, else
            `min_gain` (`robust.margin_for_splits`).
    Returns:
        The plan and its record.
    Raises:
        UserError: no tables, the tables do not fit, or no plan was found.
    """
    if not inp.stats:
        raise UserError("the workload has no tables")
    model = CostModel(inp.topo, inp.batch_size, inp.coeffs)
    plan_wide, notes, consult = gate_precision(model, choose_precision(model))
    allowed = plan_wide  # the precision the evidence supports
    two = two_model_mode(inp.topo, inp.coeffs) if two_models is None else two_models
    splits = {} if two else inp.splits
    if two and inp.splits:
        notes.append("no splits: TorchRec's estimator, which what-if plans answer to, has none")
    by_model = {s.name: s for s in inp.stats}
    by_name = {**by_model, **{s.name: s for s in part_stats(splits)}}
    base = CheapestBaseline(
        model, by_name, (baseline, *other_baselines), pending_baselines, inp.hot
    )
    book = PriceBook(inp.stats, inp.topo, inp.batch_size)
    # with splits on offer: the best plan without, its plan-wide options and its cost
    plain_at: list[tuple[Solution, PlanWide, PlanCost]] = []
    t0 = time.perf_counter()

    def solve_at(
        wide: PlanWide, tilt: float = 1.0, limit_s: float = time_limit_s
    ) -> tuple[Solution, CostModel]:
        """A solve at precision `wide`, and the cost model it minimized (what-if: the two
        models', TorchRec's weight × `tilt`)."""
        two_model: list[CostModel] = []

        def objective(classes: dict[str, list[OptionClass]]) -> CostModel:
            rate = exchange_rate(model, book.at(wide), inp.stats, classes, wide)
            base.model = TwoModelCost(model, book, tilt * rate)  # the warm start's measure
            two_model.append(base.model)
            return base.model

        def improve(p: Problem, solved: dict[str, Choice]) -> dict[str, Choice]:
            at = book.at(wide)  # TorchRec's best plan by its estimator, at this precision
            ref = (
                min(base.candidates, key=lambda c: at.rate_s(c[1]))[1] if base.candidates else None
            )
            return polish(p, solved, ref)

        def run(
            offered: dict[str, list[SplitOption]], share: float, start: Callable[[], Any]
        ) -> Solution:
            return solve_without_dominated(
                inp.stats,
                model,
                wide,
                objective if two else None,
                improve if two else None,
                splits=offered,
                time_limit_s=share * limit_s,
                seed=seed,
                workers=workers,
                mode=mode,
                progress=progress,
                warm_start=start,
            )

        sol = run({}, 1.0 if not splits else PLAIN_SHARE, base)
        if splits:  # with splits on offer, from the plan without: never worse than it
            plain = sol
            split = run(splits, 1.0 - PLAIN_SHARE, lambda: plain.choices)

            def cost(s: Solution) -> tuple[PlanWide, PlanCost]:
                w = PlanWide(wide.forward, wide.backward, s.pipeline)
                return w, model.evaluate(by_name, s.choices, w)

            plain_at[:] = [(plain, *cost(plain))]
            gain = plain_at[0][2].step_time_s / cost(split)[1].step_time_s
            sol = split if gain > 1.0 else plain
            margin, why = margin_for_splits(inp.coeffs, min_gain, split_margin)
            if set(split.choices) - set(by_model) and 1.0 < gain < 1.0 + margin:
                sol = plain
                notes.append(
                    f"no splits: the best plan with splits was predicted {gain - 1:.1%} faster "
                    f"than the best without, not the {margin:.1%} a rewrite needs ({why})"
                )
        return sol, (two_model[-1] if two_model else model)

    if not pipeline_measured(inp.coeffs):
        notes.append("pipeline base: the sparse-dist pipeline's overlap was not measured")
    elif not pipeline_pays(inp.coeffs):
        notes.append("pipeline base: the sparse-dist pipeline was not measured faster")
    sol, minimized = solve_at(plan_wide)
    if consult:  # what-if: 16-bit only where TorchRec's estimator also rates it faster
        agreed, line = torchrec_agrees(
            inp, model, sol.choices, plan_wide, sol.pipeline, book, by_name
        )
        notes.append(line)
        if not agreed:
            plan_wide = PlanWide()
            sol, minimized = solve_at(plan_wide)
    base()  # resolved by the solve already; here in case a solver path did not ask
    plan_wide = PlanWide(plan_wide.forward, plan_wide.backward, sol.pipeline)
    choices = sol.choices
    ours, ours_wide = choices, plan_wide
    hbm = hbm_budget(inp.topo, inp.batch_size, inp.stats)
    base_plan, base_cost, kept, verdicts = base.plan, base.cost, False, None
    kept_what = "torchrec plan"  # which plan `kept` keeps: TorchRec's, or the profiled plan
    if two and base.candidates:  # both models, against TorchRec's best plan by its estimator
        prices = book.at(plan_wide)
        base_plan, ref, ref_wide = min(base.candidates, key=lambda c: prices.rate_s(c[1]))
        base_cost = model.evaluate(by_name, ref, ref_wide)

        def agree(s: Solution, m: CostModel) -> Agreement:
            return both_accept(model, book, inp.stats, s.choices, ref, plan_wide, ref_wide, m)

        both = agree(sol, minimized)
        notes += both.notes
        if not both.solved.accepted:  # one model rejected the plan: weigh it more, solve again
            tilt = TILT if both.solved.rejected_by == "torchrec" else 1.0 / TILT
            again, again_minimized = solve_at(plan_wide, tilt, RETRY_SHARE * time_limit_s)
            other = agree(again, again_minimized)
            notes += [f"solved again with TorchRec's weight x {tilt:g}", *other.notes]
            if other.verdicts.worst_gain > both.verdicts.worst_gain:  # ties: the first
                both, sol, minimized = other, again, again_minimized
        gain = (
            base_cost.step_time_s
            / model.evaluate(by_name, both.choices, both.plan_wide).step_time_s
        )
        if not both.kept and gain < 1.0 + min_gain:  # below what SparseLift's model resolves
            both = both_accept(model, book, inp.stats, ref, ref, ref_wide, ref_wide)
        kept = both.kept and fits_memory(inp.topo, base_cost, hbm)
        choices, plan_wide, verdicts = both.choices, both.plan_wide, both.verdicts
        if both.kept and not kept:  # TorchRec's plan does not fit our memory model: ours
            choices, plan_wide = sol.choices, PlanWide(plan_wide.forward, plan_wide.backward)
            notes.append("TorchRec's plan does not fit SparseLift's memory model: not kept")
            verdicts = None
    elif (
        base.cost is not None
        and base.choices is not None
        and base.cost.step_time_s
        < model.evaluate(by_name, choices, plan_wide).step_time_s * (1.0 + min_gain)
        and fits_memory(inp.topo, base.cost, hbm)
    ):
        # a decomposed or timed-out solve can land above the warm start: never hand back worse;
        # and a gain smaller than the model can resolve is not worth a new plan
        choices, plan_wide, kept = base.choices, base.cost.plan_wide, True
    if verdicts is not None:
        notes.append(verdicts.line("TorchRec's plan kept" if kept else "the plan"))
    elif two:
        notes.append(verdicts_alone(model, book, by_name, choices, plan_wide))
    if current is not None and not two:
        cur_choices, cur_wide = choices_from_plan(current, inp.topo)
        cur_tables = plan_tables(current, inp.stats, inp.hot)
        cur_wide, dropped = kept_wide(model, cur_tables, cur_choices, cur_wide, allowed)
        notes += dropped
        cur_cost = model.evaluate(cur_tables, cur_choices, cur_wide)
        which = "the profiled plan"
        if current.splits and plain_at:  # its splits must pay, or the best plan without stands
            plain, plain_wide, plain_cost = plain_at[0]
            if plain_cost.step_time_s <= cur_cost.step_time_s:
                notes.append(
                    f"the profiled plan's splits are predicted not to pay: the best plan without "
                    f"splits ({plain_cost.step_time_s * 1e3:.2f} ms against "
                    f"{cur_cost.step_time_s * 1e3:.2f} ms) stands in for it"
                )
                current = to_plan(
                    inp.stats, plain.choices, inp.topo, plain_wide, module=current.module
                )
                cur_choices, cur_wide, cur_cost = dict(plain.choices), plain_wide, plain_cost
                which = "the profiled plan without its splits"
        new_s = model.evaluate(by_name, choices, plan_wide).step_time_s
        ours_s = model.evaluate(by_name, ours, ours_wide).step_time_s
        gain = 1.0 + min_gain
        if kept and ours_s * gain <= cur_cost.step_time_s < new_s * gain:
            # the baseline kept over ours is not worth leaving the profiled plan for, while ours
            # is: each change is weighed against the plan it replaces
            notes.append(
                f"the cheapest baseline is predicted only {cur_cost.step_time_s / new_s:.3f}x "
                f"faster than {which}, ours {cur_cost.step_time_s / ours_s:.3f}x: ours"
            )
            choices, plan_wide, kept, verdicts, new_s = ours, ours_wide, False, None, ours_s
        if cur_cost.step_time_s < new_s * (1.0 + min_gain) and fits_memory(inp.topo, cur_cost, hbm):
            choices, plan_wide, kept, base_plan, base_cost = (
                cur_choices,
                cur_wide,
                True,
                current,
                cur_cost,
            )
            kept_what = which.removeprefix("the ")
            ratio = cur_cost.step_time_s / new_s
            notes.append(
                f"kept {which}: the best other plan is predicted {ratio:.3f}x as fast, below "
                f"the {1 + min_gain:.2f}x a change needs"
            )
    if kept and base_plan is not None:  # a plan kept as it is: its own splits' parts
        by_name = {**by_name, **plan_tables(base_plan, inp.stats, inp.hot)}
    plan, cost = read_out(
        inp,
        Decided(choices, plan_wide, chosen_splits(splits, choices), kept_what if kept else None),
        by_name,
        sol,
        model,
        minimized,
        base_plan,
        seed=seed,
        workers=workers,
        two=two,
    )
    sol.wall_s = time.perf_counter() - t0 - base.waited_s
    return Result(plan, cost, sol, base_plan, base_cost, kept, notes, verdicts)
