"""The parts both CP-SAT models of `formulation` build the same way, in the same order.

`formulation.build_exact` and `formulation.build_aggregate` differ only in how they bound each
phase's load; everything else is built here once so that the two cannot drift apart:

* `classes_and_fixed_costs`: exactly one way per model table (itself or one of its splits) and
  one class per table of that way; each phase's fixed per-call cost as an expression of which
  sharding types and TBE groups are used; the pipeline boolean.
* `phase_upper_bounds` / `new_phase_max`: the phase max variables and their bounds.
* `minimize_step`: the objective (Σ phase max − hidden input_dist + pipeline overhead + the
  risk penalty).
* `add_memory_caps`: HBM and DDR within their caps, the pipeline's buffer included.

Times are integer nanoseconds (`to_ns`), memory integer bytes. Each builder creates its variables
and constraints in a fixed order: CP-SAT's search, hence the plan, depends on it.
"""

from __future__ import annotations

from typing import Any

from ortools.sat.python import cp_model

from sparselift.errors import UserError
from sparselift.optimizer.cost_model import Group, group_of, type_fixed_costs
from sparselift.optimizer.costs import PHASES, PhaseTimes
from sparselift.optimizer.problem import NS, Problem
from sparselift.optimizer.space import DP, OptionClass

PPM = 1_000_000  # the pipeline overlap's resolution in the integer model
# The most nanoseconds a phase's upper bound may hold: the phases' sum stays inside 64 bits
# (sums CP-SAT could still overflow, e.g. by the overlap's PPM, it refuses: `solver`)
MAX_PHASE_NS = (1 << 62) // len(PHASES)
ID_PHASE = PHASES.index("input_dist")

UseVars = dict[tuple[str, OptionClass], cp_model.IntVar]
PlaceVars = dict[tuple[str, OptionClass, int], cp_model.IntVar]


def to_ns(x: float) -> int:
    """`x` seconds as integer nanoseconds, rounded to the nearest."""
    return int(round(x * NS))


def classes_and_fixed_costs(
    p: Problem, m: cp_model.CpModel, use: UseVars
) -> tuple[list[Any], cp_model.IntVar]:
    """Exactly one way per model table (itself or one of its splits, `split[table|i]`) and one
    class per table of that way; `group_used` per group (`cost_model.Group`) and `a2a_used`
    per (collection, sharding type), implied by the chosen classes; each phase's fixed per-call
    cost as an expression of them (one input_dist and one output collective per collection's
    sharding type, the reduce-scatter's for row-wise types, `cost_model.type_fixed_costs`; one
    TBE per group, as TorchRec batches them); and the pipeline boolean.
    Returns (fixed cost per phase, sparse_dist)."""
    split_vars = []
    for s in p.stats:
        ways = p.alternatives(s.name)
        if len(ways) == 1:
            m.add_exactly_one([use[s.name, c] for c in p.classes[s.name]])
            continue
        chosen = [m.new_bool_var(f"split[{s.name}|{i}]") for i in range(len(ways))]
        m.add_exactly_one(chosen)
        for way, x in zip(ways, chosen, strict=True):
            for name in way:
                m.add(sum(use[name, c] for c in p.classes[name]) == x)
        split_vars += chosen[1:]
    groups: dict[Group, cp_model.IntVar] = {}
    for (name, c), v in use.items():
        g = group_of(p.by_name[name], c)
        if g not in groups:
            groups[g] = m.new_bool_var(f"group_used[{'/'.join(filter(None, g))}]")
        m.add_implication(v, groups[g])
    types: dict[tuple[str, str], cp_model.IntVar] = {}  # (collection, sharding type)
    for g, gv in groups.items():
        if g.sharding_type == DP:
            continue
        if g[:2] not in types:
            types[g[:2]] = m.new_bool_var(f"a2a_used[{'/'.join(filter(None, g[:2]))}]")
        m.add_implication(gv, types[g[:2]])
    coeffs = p.coeffs
    fixed_cost: list[Any] = [0] * len(PHASES)
    per_type = {st: type_fixed_costs(coeffs, st) for _, st in types}  # rs output for RW / TWRW
    per_group = PhaseTimes(lookup_fwd=coeffs.lookup_fwd.a_s, lookup_bwd=coeffs.lookup_bwd.a_s)
    for i in range(len(PHASES)):
        fixed_cost[i] = sum(to_ns(per_type[st][i]) * tv for (_, st), tv in types.items()) + sum(
            to_ns(per_group[i]) * gv for gv in groups.values()
        )
    dp = [gv for g, gv in groups.items() if g.sharding_type == DP]
    if dp:
        dp_fixed = to_ns((1 - coeffs.dp_overlap) * coeffs.dp_allreduce.a_s)
        fixed_cost[PHASES.index("dp_allreduce")] += dp_fixed * dp[0]
    if split_vars:  # a split model writes the whole pooled output once more (`recombine_fixed_s`)
        any_split = m.new_bool_var("any_split")
        m.add_max_equality(any_split, split_vars)
        whole = p.model.recombine_whole_s(p.stats)
        fixed_cost[PHASES.index("lookup_fwd")] += to_ns(whole) * any_split
    sparse_dist = m.new_bool_var("pipeline_sparse_dist")
    if not p.allow_sparse_dist:  # not measured to pay (`robust.pipeline_pays`)
        m.add(sparse_dist == 0)
    return fixed_cost, sparse_dist


def phase_upper_bounds(p: Problem, load_ub: list[float], n_use: int) -> list[int]:
    """Upper bounds of the phase max variables: the worst loads plus every fixed cost (a TBE
    per use variable at most, and each collection's four model-parallel types).

    Raises:
        UserError: a bound past `MAX_PHASE_NS`: coefficients that price a phase so (e.g. an
            edited calibration's weight) are no measurement, and the solver's sums would
            overflow its 64-bit integers.
    """
    c = p.coeffs
    rs = (c.output_dist_rs_fwd.a_s, c.output_dist_rs_bwd.a_s)
    per_call = max(*(getattr(c, ph).a_s for ph in PHASES), *rs) + c.type_overhead_s
    collections = len({t.collection or "" for t in p.tables})
    fixed_ub = to_ns(per_call) * (n_use + 4 * collections)
    bounds = [int(load_ub[i]) + fixed_ub + 1 for i in range(len(PHASES))]
    worst = max(range(len(PHASES)), key=bounds.__getitem__)
    if bounds[worst] > MAX_PHASE_NS:
        raise UserError(
            f"{c.source}: the coefficients price {PHASES[worst]} at up to "
            f"{bounds[worst] / NS:.3g} s a step, past the {MAX_PHASE_NS / NS:.3g} s a plan can be "
            "solved for: recalibrate (`sparselift analyze`) or check the calibration's numbers"
        )
    return bounds


def new_phase_max(m: cp_model.CpModel, phase_ub: list[int]) -> list[cp_model.IntVar]:
    return [
        m.new_int_var(0, max(1, phase_ub[i]), f"phase_max[{ph}]") for i, ph in enumerate(PHASES)
    ]


def minimize_step(
    p: Problem,
    m: cp_model.CpModel,
    phase_max: list[cp_model.IntVar],
    phase_ub: list[int],
    sparse_dist: cp_model.IntVar,
    use: UseVars,
    work_total: Any = 0,
) -> None:
    """The objective: Σ phase max − what the pipeline hides of input_dist + its overhead, plus
    the secondary objective: `risk_penalty_ns` per risky choice (`robust`), the pipeline one.
    Where ranks share cores (`crowding`), the step part is at least crowd_factor × the mean
    rank's work less the dense step (a constant outside the objective), from `work_total`: Σ
    over ranks and phases of every rank's load and fixed costs."""
    coeffs = p.coeffs
    hidden = m.new_int_var(0, max(1, phase_ub[ID_PHASE]), "input_dist_hidden_by_sparse_dist")
    m.add(hidden * PPM <= int(round(coeffs.pipeline_overlap * PPM)) * phase_max[ID_PHASE])
    m.add(hidden <= max(1, phase_ub[ID_PHASE]) * sparse_dist)
    step = sum(phase_max) - hidden + to_ns(coeffs.pipeline_overhead_s) * sparse_dist
    if coeffs.crowd_factor > 0:
        W, k = p.topo.world_size, int(round(coeffs.crowd_factor * PPM))
        dense = to_ns(coeffs.dense_step_s)
        ub = max(k, PPM) * (sum(phase_ub) + dense) // PPM + 1
        crowded = m.new_int_var(0, ub, "step_on_shared_cores")
        m.add(crowded >= step)
        m.add(W * PPM * crowded >= k * work_total + W * (k - PPM) * dense)
        step = crowded
    if p.risk_penalty_ns:
        risky = [v for key, v in use.items() if key in p.risky]
        step += p.risk_penalty_ns * (sum(risky) + sparse_dist)
    m.minimize(step)


def add_memory_caps(
    p: Problem,
    m: cp_model.CpModel,
    hbm_load: Any,
    ddr_load: Any,
    sparse_dist: cp_model.IntVar,
    *,
    buffer: int,
    hbm_cap: int,
    ddr_cap: int,
    name: str | None = None,
) -> None:
    """HBM and DDR loads (the pipeline's buffer where the tables live) within their caps."""
    gpu = p.on_gpu
    hbm = m.add(hbm_load + (buffer * sparse_dist if gpu else 0) <= hbm_cap)
    if name is not None:
        hbm.with_name(f"hbm[{name}]")
    ddr = m.add(ddr_load + (0 if gpu else buffer * sparse_dist) <= ddr_cap)
    if name is not None:
        ddr.with_name(f"ddr[{name}]")
