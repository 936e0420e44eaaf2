"""Robust where evidence is missing: which options a plan may use, and which it should avoid.

Four rules, applied around the solve (`optimize`):

* *No dominated UVM caching.* UVM caching only saves HBM, and its miss cost is ≥ 0, so where a
  table's fused option fits it buys nothing. The solve first runs without UVM classes
  (`without_uvm`; a table none of whose other classes fits a rank on its own keeps its UVM
  classes). Only if that solve finds no plan (memory) is it run again with every class, and
  then the risk penalty below makes each UVM table cost something. Whatever is chosen is then
  cleaned by `drop_dominated_uvm`: a UVM table whose fused option, at the same ranks, still fits
  every rank's memory is switched to fused. Both steps are plain
  functions of the inputs: the plan stays deterministic. (Solving twice, rather than one model
  with UVM penalized, is what makes it robust: no penalty weight can be too small to matter.)
* *A secondary objective.* Among plans of nearly equal predicted step, the one with fewer risky
  options wins: each risky choice (`risky_class`, and the sparse-dist pipeline) adds
  `risk_penalty_ns` to the CP-SAT objective. The penalties of all risky choices together are at
  most RISK_TOLERANCE of a reference step (the cheapest-average start's average rank), so the
  secondary objective can cost at most about that share of predicted step against the
  step-optimal plan. A split's parts are risky while the split model's own costs (batch
  transform, recombination) are not both measured.
* *Only what is measured to pay.* The sparse-dist pipeline only when its overlap was measured
  and the same profiles measured it faster (`pipeline_pays`); 16-bit collectives only when the
  quantize cost and the bytes' cost were measured (`precision_measured`) or, planning for
  unprofiled hardware, when TorchRec's estimator also rates the plan faster at 16 bits
  (`optimize`). The profiled plan, kept as it
  is, keeps either only where no profile measured it to cost (`kept_wide`).
* *A rewrite only past the model's error.* No profile has run a split the plan would make, so a
  plan with splits is taken over the best plan without only when it is predicted faster by more
  than the model is measured to miss a plan it was not fitted on (`margin_for_splits`), or, where
  a measurement will decide before anything ships (`tune`), by a margin the caller sets. A profiled
  plan with splits is weighed as it is only while the model prices its splits as paying; else
  the best plan without splits stands in for it (`optimize`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sparselift.errors import UserError
from sparselift.optimizer.coefficients import Coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PHASES
from sparselift.optimizer.feasibility import feasible_classes, part_classes
from sparselift.optimizer.placement import cheapest_average
from sparselift.optimizer.problem import NS, Problem, Solution, load_over_ranks
from sparselift.optimizer.solver import solve
from sparselift.optimizer.space import (
    DP,
    FUSED,
    RW,
    TWRW,
    UVM_CACHING,
    Choice,
    OptionClass,
    PlanWide,
)
from sparselift.optimizer.split_options import SplitOption
from sparselift.optimizer.table_stats import TableStats

RISK_TOLERANCE = 0.005  # share of the step all risky choices' penalties may add up to


def risky_class(c: OptionClass, coeffs: Coefficients) -> bool:
    """Whether choosing class `c` is a risk the secondary objective counts.

    UVM caching always (its miss cost is a preset's guess on most hardware, and TorchRec prices
    it far higher); data-parallel when a calibration measured the plan's other costs but not
    the allreduce, the dense TBE's backward (`dense_bwd_scale`: else priced by analogy with the
    fused kernels') or the trainer's optimizer pass over the replicas (`dense_grad_b_s`): its
    cost rests on an assumption where the alternatives' do not;
    row-wise or table-row-wise when its output collective, a reduce-scatter, is priced by
    analogy where the alternatives' all-to-all is measured: its own coefficients
    (`output_dist_rs_fwd` / `_bwd`) not measured while the all-to-all's are, or measured on
    profiles that did not run this type (where the calibration says which types ran:
    table-row-wise's output also crosses hosts as an all-to-all, so a fit on row-wise calls
    prices it by analogy too). Where no output collective was measured, all are assumptions
    alike: no such rule.
    """
    if c.kernel == UVM_CACHING:
        return True
    if c.sharding_type in (RW, TWRW):
        if not (coeffs.measured("output_dist_rs_fwd") and coeffs.measured("output_dist_rs_bwd")):
            return coeffs.measured("output_dist_fwd") or coeffs.measured("output_dist_bwd")
        return bool(coeffs.profiled_types) and c.sharding_type not in coeffs.profiled_types
    if c.sharding_type != DP or not coeffs.any_measured():
        return False
    return not all(
        coeffs.measured(k) for k in ("dp_allreduce", "dense_bwd_scale", "dense_grad_b_s")
    )


def split_costs_measured(coeffs: Coefficients) -> bool:
    """Whether what a split model adds to a step (the batch transform, the recombination) was
    measured; where not, a split's parts count as risky choices."""
    return coeffs.measured("batch_transform") and coeffs.measured("recombine_b_s")


def pipeline_pays(coeffs: Coefficients) -> bool:
    """Whether the sparse-dist pipeline may be chosen: measured (`pipeline_measured`), and
    measured faster by the profiles that measured it (`Coefficients.pipeline_pays`)."""
    return pipeline_measured(coeffs) and coeffs.pipeline_pays


def pipeline_measured(coeffs: Coefficients) -> bool:
    """Whether the sparse-dist pipeline's pay-off is measured: its overlap came from profiles.

    The overlap is fitted on a plan profiled under each pipeline, with the pipeline's overhead
    (`analysis.pipeline_overlap`): overlap · input_dist − overhead is the net saving those
    profiles measured at the low end of its interval. A calibration carries the overhead it
    measured, so both are measured; one made before the overhead was measured fitted its
    overlap net of the preset's overhead, which then stands, and the net is still the measured
    one. Either way the overlap's evidence is what says the pay-off was measured.
    """
    return coeffs.measured("pipeline_overlap")


def precision_measured(coeffs: Coefficients, multi_host: bool) -> bool:
    """Whether 16-bit collectives' pay-off is measured: the (de)quantize cost and the cost of the
    bytes it saves (the pooled-embedding distributions' per-byte cost on one host, the
    inter-host one across hosts) both came from a profile."""
    if not coeffs.measured("quantize_b_s"):
        return False
    if multi_host:
        return coeffs.measured("inter_host_b_s")
    return coeffs.measured("output_dist_fwd") and coeffs.measured("output_dist_bwd")


def sixteen_bit(plan_wide: PlanWide) -> bool:
    """Whether either direction's collectives run at 16 bits."""
    return plan_wide.forward != "fp32" or plan_wide.backward != "fp32"


def kept_wide(
    model: CostModel,
    tables: Mapping[str, TableStats],
    choices: Mapping[str, Choice],
    wide: PlanWide,
    allowed: PlanWide,
) -> tuple[PlanWide, list[str]]:
    """The plan-wide options of a plan the optimizer weighs as it is (the profiled plan).

    It keeps its shards, and its 16-bit collectives and sparse-dist pipeline unless profiles
    measured them not to pay: 16 bits where their cost was measured and `allowed` (the
    precision `gate_precision` settled on) is fp32; sparse-dist where its overlap was measured
    and it was measured no faster, or the model prices these shards faster under the base
    pipeline. What no profile measured
    stays as the user runs it: dropping it would be a choice without evidence too.

    Returns:
        (the plan-wide options, one line per option dropped)
    """
    out, lines = wide, []
    multi = model.topo.num_hosts > 1
    if sixteen_bit(wide) and not sixteen_bit(allowed) and precision_measured(model.coeffs, multi):
        out = PlanWide(allowed.forward, allowed.backward, wide.pipeline)
        lines.append("the profiled plan's 16-bit collectives are measured not to pay: fp32")
    base = PlanWide(out.forward, out.backward, "base")
    if (
        out.pipeline != "base"
        and pipeline_measured(model.coeffs)
        and (
            not pipeline_pays(model.coeffs)
            or model.evaluate(tables, choices, base).step_time_s
            <= model.evaluate(tables, choices, out).step_time_s
        )
    ):
        out = base
        lines.append("the profiled plan's sparse-dist pipeline is measured not to pay: base")
    return out, lines


def without_uvm(classes: Mapping[str, list[OptionClass]]) -> dict[str, list[OptionClass]] | None:
    """Every table's classes without UVM caching, or None when that removes nothing.

    A table none of whose non-UVM classes fits a rank keeps all its classes: memory forces UVM.
    """
    out = {}
    for name, cs in classes.items():
        plain = [c for c in cs if c.kernel != UVM_CACHING]
        out[name] = plain or list(cs)
    return None if out == dict(classes) else out


def risk_penalty_ns(p: Problem) -> int:
    """The secondary objective's penalty per risky choice, in the model's nanoseconds.

    RISK_TOLERANCE of a reference step — the cheapest-average start's load on the average rank
    plus the dense step, a step no plan beats by much — shared among every risky
    choice the model could make (one per table with a risky class, one for the pipeline), so
    that all of them together stay within the tolerance; at least 1 ns where there is any.
    """
    n = len({name for name, _ in p.risky})
    n += 1 if p.allow_sparse_dist else 0
    if n == 0:
        return 0
    topo = p.topo
    step = p.coeffs.dense_step_s
    for name, ch in cheapest_average(p).items():
        total = load_over_ranks(
            p.terms(name, ch.cls), ch.cls, topo.world_size, topo.local_world_size
        )
        step += sum(total[: len(PHASES)]) / topo.world_size
    return max(1, int(RISK_TOLERANCE * step * NS / n))


def drop_dominated_uvm(p: Problem, choices: dict[str, Choice], pipeline: str) -> dict[str, Choice]:
    """`choices` with every UVM-cached table switched to fused where that fits memory.

    Tables are tried in the plan's order; a switch (the fused class of the same sharding type
    and shards, at the same ranks or host) is kept when every rank's memory still fits. The
    predicted step is not asked: with a miss cost ≥ 0, fused can cost more only by one kernel
    call's fixed cost (when it adds a (type, kernel) group), a gain within the model's error
    that does not justify an option TorchRec's estimator prices far higher.

    Args:
        p: the problem (its memory caps and pipeline buffer).
        choices: a plan's choices.
        pipeline: the plan's pipeline ("base" or "sparse-dist").
    Returns:
        The cleaned choices (`choices` itself when no table uses UVM caching).
    """
    uvm = [name for name, ch in choices.items() if ch.cls.kernel == UVM_CACHING]
    if not uvm:
        return choices
    wide = PlanWide(p.plan_wide.forward, p.plan_wide.backward, pipeline)
    out = dict(choices)
    for name in uvm:
        ch = out[name]
        fused = OptionClass(ch.cls.sharding_type, FUSED, ch.cls.shards)
        trial = {**out, name: Choice(fused, ch.ranks, ch.host)}
        cost = p.model.evaluate(p.by_name, trial, wide)
        fits = all(
            (r.memory_bytes <= p.hbm_cap or not p.on_gpu) and r.ddr_bytes <= p.ddr_cap
            for r in cost.per_rank
        )
        if fits:
            out = trial
    return out


def robust_problem(
    stats: list[TableStats],
    model: CostModel,
    plan_wide: PlanWide,
    classes: dict[str, list[OptionClass]],
    splits: dict[str, list[SplitOption]] | None = None,
) -> Problem:
    """A `Problem` with this module's rules set: the pipeline only where measured to pay, the risky
    (table, class) pairs and the penalty per risky choice."""
    coeffs = model.coeffs
    parts = {q.name for opts in (splits or {}).values() for o in opts for q in o.parts}
    split_risky = not split_costs_measured(coeffs)
    risky = frozenset(
        (name, c)
        for name, cs in classes.items()
        for c in cs
        if risky_class(c, coeffs) or (split_risky and name in parts)
    )
    p = Problem(stats, model, plan_wide, classes, pipeline_pays(coeffs), risky, splits=splits or {})
    p.risk_penalty_ns = risk_penalty_ns(p)
    return p


def solve_without_dominated(
    stats: list[TableStats],
    model: CostModel,
    plan_wide: PlanWide,
    objective: Callable[[dict[str, list[OptionClass]]], CostModel] | None = None,
    polish: Callable[[Problem, dict[str, Choice]], dict[str, Choice]] | None = None,
    splits: dict[str, list[SplitOption]] | None = None,
    **solve_kw: Any,
) -> Solution:
    """Solve without UVM caching where memory allows, then drop the UVM choices that buy nothing.

    Args:
        stats: the tables.
        model: the cost model (which classes fit: its memory).
        plan_wide: the collective precision (its pipeline is the solver's).
        objective: given the classes one solve chooses from, the cost model it minimizes (what-if
            planning's two models, `whatif`); None: `model`.
        polish: what improves the solved choices (given the problem), before the UVM choices
            that buy nothing are dropped; None: nothing.
        splits: per table, the splits it may take (`split_options`); None: none.
        **solve_kw: `solver.solve`'s keywords (time limit, seed, workers, mode, progress, warm
            start).
    Returns:
        The solution, its choices cleaned by `drop_dominated_uvm`.
    Raises:
        UserError: the tables do not fit (`feasible_classes`) or no plan was found even with UVM
            caching.
    """
    classes = feasible_classes(model, stats, plan_wide)
    if splits:
        classes.update(part_classes(model, splits, plan_wide))

    def problem(cs: dict[str, list[OptionClass]]) -> Problem:
        return robust_problem(stats, objective(cs) if objective else model, plan_wide, cs, splits)

    plain = without_uvm(classes)
    if plain is not None:
        p = problem(plain)
        try:
            sol = solve(p, **solve_kw)
        except UserError:  # memory forces UVM caching somewhere: solve again with it
            pass
        else:
            return _cleaned(p, sol, polish)
    p = problem(classes)
    return _cleaned(p, solve(p, **solve_kw), polish)


def _cleaned(
    p: Problem,
    sol: Solution,
    polish: Callable[[Problem, dict[str, Choice]], dict[str, Choice]] | None,
) -> Solution:
    """`sol` with its choices polished, then its dominated UVM choices dropped."""
    if polish is not None:
        sol.choices = polish(p, sol.choices)
    sol.choices = drop_dominated_uvm(p, sol.choices, sol.pipeline)
    return sol


def gate_precision(model: CostModel, wanted: PlanWide) -> tuple[PlanWide, list[str], bool]:
    """The collective precision evidence allows, given what the cost model says pays (`wanted`).

    16-bit stays where its pay-off was measured (`precision_measured`). With a profile of this
    hardware that did not measure it, fp32. Planning for unprofiled hardware (no coefficient
    measured), it stays pending TorchRec's verdict (`agreement.torchrec_agrees`, after the solve).

    Returns:
        (precision to solve at, lines saying why, whether TorchRec's estimator must be consulted).
    """
    if not sixteen_bit(wanted):
        return wanted, [], False
    coeffs, label = model.coeffs, f"{wanted.forward}/{wanted.backward}"
    if precision_measured(coeffs, model.topo.num_hosts > 1):
        return wanted, [f"comm precision {label}: its cost and savings are measured"], False
    if coeffs.any_measured():
        line = (
            f"comm precision fp32: the model prices {label} faster, but the profile did not "
            "measure the quantize cost and the bytes saved"
        )
        return PlanWide(), [line], False
    return wanted, [], True


def margin_for_splits(
    coeffs: Coefficients, min_gain: float, given: float | None = None
) -> tuple[float, str]:
    """The share by which a plan with splits must be predicted faster than the best plan without
    to be taken, and where that share comes from.

    Args:
        coeffs: the coefficients planned with; their `held_out_error` (the calibration's largest
            leave-one-out error) is the margin where it was measured.
        min_gain: the margin otherwise (`optimize --min-gain`: the error assumed).
        given: a margin the caller sets (`optimize --split-margin`): `tune` measures a plan
            before it ships, so it tries a split the model rates faster by less than its error.
    """
    if given is not None:
        return given, "--split-margin"
    if coeffs.held_out_error is not None:
        of = f", of {coeffs.held_out_by}" if coeffs.held_out_by else ""
        return coeffs.held_out_error, f"the calibration's largest leave-one-out error{of}"
    return min_gain, "--min-gain: no leave-one-out error measured"
