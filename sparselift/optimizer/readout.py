"""Read a solved plan out: its predicted costs, the solver's record, its provenance, the evidence
of every coefficient it was priced with and the statistics it was made from, as a `plans.Plan`.

Kept apart from `optimize` (which decides what the plan is) as OR-Tools' samples keep building,
solving and reading out apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from sparselift import plans
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PlanCost
from sparselift.optimizer.inputs import Inputs
from sparselift.optimizer.planio import plan_topology, statistics_digest, to_plan
from sparselift.optimizer.problem import Solution
from sparselift.optimizer.space import Choice, PlanWide
from sparselift.optimizer.split_options import SplitOption
from sparselift.optimizer.table_stats import TableStats


@dataclass
class Decided:
    """What planning decided.

    Attributes:
        choices: each table's (or virtual table's) choice.
        plan_wide: comm precision and pipeline.
        splits: the split options taken.
        kept: which plan was kept as it is ("torchrec plan", "profiled plan", ...); None where the
            plan is SparseLift's.
    """

    choices: Mapping[str, Choice]
    plan_wide: PlanWide
    splits: list[SplitOption]
    kept: str | None = None


def read_out(
    inp: Inputs,
    decided: Decided,
    by_name: Mapping[str, TableStats],
    sol: Solution,
    model: CostModel,
    minimized: CostModel,
    base_plan: plans.Plan | None,
    *,
    seed: int,
    workers: int,
    two: bool,
) -> tuple[plans.Plan, PlanCost]:
    """The plan file's content for a decision, and its cost under SparseLift's model.

    Args:
        inp: what was planned for.
        decided: the choices, plan-wide options, splits and which plan was kept.
        by_name: every table's and virtual table's statistics the choices name.
        sol: the CP-SAT solve (its bound, status, mode and time).
        model: SparseLift's cost model (the plan's predicted costs).
        minimized: the model the solve minimized (what-if: both models'), for objective and gap.
        base_plan: the plan kept as it is, where `decided.kept` names one.
        seed, workers: the solver's, recorded.
        two: whether the objective was both models' (what-if).
    Returns:
        (the plan, its predicted cost).
    """
    choices, plan_wide = decided.choices, decided.plan_wide
    cost = model.evaluate(by_name, choices, plan_wide)
    objective = minimized.evaluate(by_name, choices, plan_wide).step_time_s
    gap = max(0.0, (objective - sol.bound_s) / objective) if objective > 0 else 0.0
    solver_rec = {
        "name": f"cp-sat ({sol.mode})",
        "status": sol.status + (f" ({decided.kept} kept)" if decided.kept else ""),
        "objective": objective,
        "bound": min(sol.bound_s, objective),
        "gap": gap,
        "time_s": round(sol.det_time_s, 3),
        "seed": seed,
        "workers": workers,
    }
    if two:  # what the objective and bound are made of
        solver_rec["objective_of"] = "SparseLift's step + weight x TorchRec's estimator (whatif)"
        solver_rec["torchrec_weight"] = getattr(minimized, "weight", 0.0)
    provenance = {
        **inp.provenance,
        "coefficients": inp.coeffs.source,
        "batch_size": inp.batch_size,
        "tool": "sparselift optimize",
    }
    predicted = cost.predicted()
    if decided.splits:  # what each split was priced at, for reports
        predicted["splits"] = {
            o.table: {"option": o.label, "hot_share": o.hot_share} for o in decided.splits
        }
    if decided.kept and base_plan is not None:  # the kept plan as it is (its splits too)
        precision = plans.CommPrecision(forward=plan_wide.forward, backward=plan_wide.backward)
        plan = dataclasses.replace(
            base_plan,
            topology=plan_topology(inp.topo),  # a profiled plan names no preset
            comm_precision=precision,
            pipeline=plan_wide.pipeline,
            predicted=predicted,
            solver=solver_rec,
            provenance=provenance,
        )
    else:
        plan = to_plan(
            inp.stats,
            choices,
            inp.topo,
            plan_wide,
            predicted=predicted,
            solver=solver_rec,
            provenance=provenance,
            splits=decided.splits,
        )
    plan = dataclasses.replace(  # a kept plan gets our records too: evidence, statistics
        plan,
        evidence=inp.coeffs.evidence_dict(),
        statistics=statistics_digest(inp.stats, inp.batch_size),
    )
    return plan, cost
