"""The two CP-SAT models of a `Problem` (the solver solves them and reads their answers out).

Both minimize dense + Σ_phase phase_max − hidden_input_dist + overhead·sparse_dist (+ a small
penalty per risky choice, `robust`), where
phase_max ≥ the phase's load on every rank (exact) or on the average rank (aggregate), hidden ≤
overlap·phase_max[input_dist] and hidden = 0 unless the sparse-dist pipeline is chosen; memory
per rank (HBM and DDR) is a hard constraint. Times are integer nanoseconds, memory integer bytes.

A model table with splits on offer (`Problem.splits`) gets one boolean per way of running it,
`split[table|i]` (itself, or split option i), exactly one true; the classes of each way's tables
(itself, or the option's parts) sum to it. Everything below then holds for every table of the
way chosen; the others carry no load.

* `build_exact`: booleans `use[table|class]` and, for placed shards, `place[table|class@rank]`
  (Σ_rank place = shards·use: a column-wise table's shards sit on distinct ranks, which removes
  the symmetry of identical shards) or `place[table|class@host]` for table-row-wise. Every rank's
  phase load is linear in them (own / same host / other host terms). Implied cuts (each phase's
  max ≥ the load every rank carries + one table's own shard load) give the relaxation what a
  single heavy table costs, without which small instances end far from proved.
* `build_aggregate`: only `use`, against an aggregated load model: each phase's max ≥ the average
  rank's load (exact for replicated / row-wise terms, Σ shards·(own + (L−1)·same host + (W−L)·
  other host)/W for placed shards) and ≥ any single shard's own load; memory ≤ 95 % of the total
  capacity (the rest for the placement's fragmentation). A relaxation, so its proven bound is a
  valid lower bound of the real optimum; the shards are placed afterwards (`placement`).

Both share one builder for the class structure and fixed per-call costs, the step objective,
the memory constraints and the warm start. Variables and constraints are created in a fixed
order: CP-SAT's search, hence the plan, depends on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from sparselift.optimizer.cost_model import group_of, type_fixed_costs
from sparselift.optimizer.costs import DDR_COL, HBM_COL, LOAD_WIDTH, PHASES, PhaseTimes
from sparselift.optimizer.placement import cheapest_average
from sparselift.optimizer.problem import NS, Problem, load_over_ranks
from sparselift.optimizer.space import DP, Choice, OptionClass

PPM = 1_000_000  # the pipeline overlap's resolution in the integer model
ID_PHASE = PHASES.index("input_dist")
AGGREGATE_MEMORY_SHARE = 0.95  # of the total capacity, the rest kept for the placement

UseVars = dict[tuple[str, OptionClass], cp_model.IntVar]
PlaceVars = dict[tuple[str, OptionClass, int], cp_model.IntVar]


@dataclass
class CpModelVars:
    """A CP-SAT model and the variables to read its answer from, named after what they decide.

    Attributes:
        model: the CP-SAT model.
        use: `use[table, class]`, true for the class chosen for the table.
        place: `place[table, class, rank]` (or host, for table-row-wise); empty when decomposed.
        sparse_dist: true when the sparse-dist pipeline is chosen.
        constant_s: seconds the objective leaves out (the dense step).
        decomposed: built by `build_aggregate` (classes only; shards placed afterwards).
    """

    model: cp_model.CpModel
    use: UseVars
    place: PlaceVars
    sparse_dist: cp_model.IntVar
    constant_s: float
    decomposed: bool


def _ns(x: float) -> int:
    return int(round(x * NS))


# ------------------------------------------------------------------------------- shared builder
def _classes_and_fixed_costs(
    p: Problem, m: cp_model.CpModel, use: UseVars
) -> tuple[list[Any], cp_model.IntVar]:
    """Exactly one way per model table (itself or one of its splits, `split[table|i]`) and one
    class per table of that way; `group_used` per (sharding type, kernel) group and `a2a_used`
    per sharding type, implied by the chosen classes; each phase's fixed per-call cost as an
    expression of them (one input_dist and one output collective per sharding type, the
    reduce-scatter's for row-wise types, `cost_model.type_fixed_costs`; one TBE per group, as
    TorchRec batches them); and the pipeline boolean.
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
    groups: dict[tuple[str, str], cp_model.IntVar] = {}
    for (_, c), v in use.items():
        g = group_of(c)
        if g not in groups:
            groups[g] = m.new_bool_var(f"group_used[{g[0]}/{g[1]}]")
        m.add_implication(v, groups[g])
    types: dict[str, cp_model.IntVar] = {}
    for (st, _), gv in groups.items():
        if st != DP and st not in types:
            types[st] = m.new_bool_var(f"a2a_used[{st}]")
        if st != DP:
            m.add_implication(gv, types[st])
    coeffs = p.coeffs
    fixed_cost: list[Any] = [0] * len(PHASES)
    per_type = {st: type_fixed_costs(coeffs, st) for st in types}  # rs output for RW / TWRW
    per_group = PhaseTimes(lookup_fwd=coeffs.lookup_fwd.a_s, lookup_bwd=coeffs.lookup_bwd.a_s)
    for i in range(len(PHASES)):
        fixed_cost[i] = sum(_ns(per_type[st][i]) * tv for st, tv in types.items()) + sum(
            _ns(per_group[i]) * gv for gv in groups.values()
        )
    dp = [gv for (st, _), gv in groups.items() if st == DP]
    if dp:
        dp_fixed = _ns((1 - coeffs.dp_overlap) * coeffs.dp_allreduce.a_s)
        fixed_cost[PHASES.index("dp_allreduce")] += dp_fixed * dp[0]
    if split_vars:  # a split model writes the whole pooled output once more (`recombine_fixed_s`)
        any_split = m.new_bool_var("any_split")
        m.add_max_equality(any_split, split_vars)
        whole = p.model.recombine_whole_s(p.stats)
        fixed_cost[PHASES.index("lookup_fwd")] += _ns(whole) * any_split
    sparse_dist = m.new_bool_var("pipeline_sparse_dist")
    if not p.allow_sparse_dist:  # its pay-off is not measured (`robust.pipeline_measured`)
        m.add(sparse_dist == 0)
    return fixed_cost, sparse_dist


def _phase_upper_bounds(p: Problem, load_ub: list[float], n_use: int) -> list[int]:
    """Upper bounds of the phase max variables: the worst loads plus every fixed cost."""
    c = p.coeffs
    rs = (c.output_dist_rs_fwd.a_s, c.output_dist_rs_bwd.a_s)
    fixed_ub = _ns(max(*(getattr(c, ph).a_s for ph in PHASES), *rs)) * (n_use + 4)
    return [int(load_ub[i]) + fixed_ub + 1 for i in range(len(PHASES))]


def _new_phase_max(m: cp_model.CpModel, phase_ub: list[int]) -> list[cp_model.IntVar]:
    return [
        m.new_int_var(0, max(1, phase_ub[i]), f"phase_max[{ph}]") for i, ph in enumerate(PHASES)
    ]


def _minimize_step(
    p: Problem,
    m: cp_model.CpModel,
    phase_max: list[cp_model.IntVar],
    phase_ub: list[int],
    sparse_dist: cp_model.IntVar,
    use: UseVars,
) -> None:
    """The objective: Σ phase max − what the pipeline hides of input_dist + its overhead, plus
    the secondary objective: `risk_penalty_ns` per risky choice (`robust`), the pipeline one."""
    coeffs = p.coeffs
    hidden = m.new_int_var(0, max(1, phase_ub[ID_PHASE]), "input_dist_hidden_by_sparse_dist")
    m.add(hidden * PPM <= int(round(coeffs.pipeline_overlap * PPM)) * phase_max[ID_PHASE])
    m.add(hidden <= max(1, phase_ub[ID_PHASE]) * sparse_dist)
    step = sum(phase_max) - hidden + _ns(coeffs.pipeline_overhead_s) * sparse_dist
    if p.risk_penalty_ns:
        risky = [v for key, v in use.items() if key in p.risky]
        step += p.risk_penalty_ns * (sum(risky) + sparse_dist)
    m.minimize(step)


def _add_memory_caps(
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


def add_warm_start(p: Problem, built: CpModelVars, hint: Mapping[str, Choice] | None) -> None:
    """Hint `hint` (a plan's choices, where its options are in our space) to CP-SAT.

    The decomposed model without a hint gets `cheapest_average`: without a start CP-SAT may spend
    its budget before a first solution. The exact model without a hint gets none.
    """
    if built.decomposed:
        hint = hint or cheapest_average(p)
    elif not hint:
        return
    m, use, place = built.model, built.use, built.place
    for s in p.tables:
        ch = hint.get(s.name)
        if ch is None and any(way[0] in hint for way in p.alternatives(s.split_of or "")):
            for c in p.classes[s.name]:  # another way of its model table is hinted
                m.add_hint(use[s.name, c], False)
            continue
        if ch is None or (s.name, ch.cls) not in use:
            continue
        for c in p.classes[s.name]:
            m.add_hint(use[s.name, c], c == ch.cls)
        if ch.cls.located == "rank":
            for r in range(p.topo.world_size):
                if (s.name, ch.cls, r) in place:
                    m.add_hint(place[s.name, ch.cls, r], r in ch.ranks)
        elif ch.cls.located == "host" and ch.host is not None:
            for h in range(p.topo.num_hosts):
                if (s.name, ch.cls, h) in place:
                    m.add_hint(place[s.name, ch.cls, h], h == ch.host)
    m.add_hint(built.sparse_dist, False)


# ----------------------------------------------------------------------------------------- exact
@dataclass
class _RankLoadParts:
    """Every rank's load in the exact model: uniform + its host's part + its own part."""

    uniform: list[list[Any]]  # per load column: terms every rank carries
    host_part: list[list[list[Any]]]  # per host, per column
    own_part: list[list[list[Any]]]  # per rank, per column
    load_ub: list[float]  # per column: Σ over tables of the worst class's load
    single: list[dict[str, list[Any]]]  # per phase, per table: its shard's rank's extra load


def _exact_load_parts(p: Problem, use: UseVars, place: PlaceVars) -> _RankLoadParts:
    W, L, H = p.topo.world_size, p.topo.local_world_size, p.topo.num_hosts
    nph = len(PHASES)
    uniform: list[list[Any]] = [[] for _ in range(LOAD_WIDTH)]
    host_part: list[list[list[Any]]] = [[[] for _ in range(LOAD_WIDTH)] for _ in range(H)]
    own_part: list[list[list[Any]]] = [[[] for _ in range(LOAD_WIDTH)] for _ in range(W)]
    load_ub = [0.0] * LOAD_WIDTH
    single: list[dict[str, list[Any]]] = [{} for _ in PHASES]
    for s in p.tables:
        worst = [0.0] * LOAD_WIDTH
        for c in p.classes[s.name]:
            terms = p.terms(s.name, c)
            v = use[s.name, c]
            scale = [NS] * nph + [1, 1]
            if terms.located == "all":
                for i in range(LOAD_WIDTH):
                    uniform[i].append(int(round(terms.own[i] * scale[i])) * v)
            elif terms.located == "host":
                for i in range(LOAD_WIDTH):
                    uniform[i].append(int(round(terms.remote_inter[i] * scale[i])) * v)
                    d = int(round((terms.own[i] - terms.remote_inter[i]) * scale[i]))
                    if d > 0 and i < nph:
                        single[i].setdefault(s.name, []).append(d * v)
                    for h in range(H):
                        if d:
                            host_part[h][i].append(d * place[s.name, c, h])
            else:
                for i in range(LOAD_WIDTH):
                    own, intra, inter = terms.own[i], terms.remote_intra[i], terms.remote_inter[i]
                    uniform[i].append(int(round(c.shards * inter * scale[i])) * v)
                    dh = int(round((intra - inter) * scale[i]))
                    do = int(round((own - intra) * scale[i]))
                    # the shard's rank, same-host terms included
                    extra = do + (min(dh, 0) if H > 1 else 0)
                    if extra > 0 and i < nph:
                        single[i].setdefault(s.name, []).append(extra * v)
                    for r in range(W):
                        if dh and H > 1:
                            host_part[r // L][i].append(dh * place[s.name, c, r])
                        if do:
                            own_part[r][i].append(do * place[s.name, c, r])
                    if H == 1:  # every placed shard is on this host: fold the host term in
                        uniform[i].append(int(round(c.shards * (intra - inter) * scale[i])) * v)
            for i in range(LOAD_WIDTH):
                worst[i] = max(
                    worst[i],
                    c.shards
                    * max(terms.own[i], terms.remote_intra[i], terms.remote_inter[i])
                    * scale[i],
                )
        for i in range(LOAD_WIDTH):
            load_ub[i] += worst[i]
    return _RankLoadParts(uniform, host_part, own_part, load_ub, single)


def build_exact(p: Problem) -> CpModelVars:
    """The exact model: every table's class and the ranks (or host) of its shards.

    Args:
        p: the problem.
    Returns:
        The model and its variables, without a warm start (`add_warm_start`).
    """
    W, L, H = p.topo.world_size, p.topo.local_world_size, p.topo.num_hosts
    m = cp_model.CpModel()
    use: UseVars = {}
    place: PlaceVars = {}
    for s in p.tables:
        for c in p.classes[s.name]:
            use[s.name, c] = v = m.new_bool_var(f"use[{s.name}|{c.label}]")
            if c.located == "rank":
                zs = [m.new_bool_var(f"place[{s.name}|{c.label}@rank{r}]") for r in range(W)]
                for r, z in enumerate(zs):
                    place[s.name, c, r] = z
                m.add(sum(zs) == c.shards * v)
            elif c.located == "host":
                zs = [m.new_bool_var(f"place[{s.name}|{c.label}@host{h}]") for h in range(H)]
                for h, z in enumerate(zs):
                    place[s.name, c, h] = z
                m.add(sum(zs) == v)
    fixed_cost, sparse_dist = _classes_and_fixed_costs(p, m, use)
    parts = _exact_load_parts(p, use, place)
    shared = []
    for i in range(len(PHASES)):
        sv = m.new_int_var(0, int(parts.load_ub[i]) + 1, f"uniform_load[{PHASES[i]}]")
        m.add(sv == sum(parts.uniform[i]))
        shared.append(sv)
    phase_ub = _phase_upper_bounds(p, parts.load_ub, len(use))
    phase_max = _new_phase_max(m, phase_ub)
    for q in range(W):
        h = q // L
        rank_load = [
            shared[i] + sum(parts.host_part[h][i]) + sum(parts.own_part[q][i]) + fixed_cost[i]
            for i in range(len(PHASES))
        ]
        for i in range(len(PHASES)):
            m.add(phase_max[i] >= rank_load[i])
    _minimize_step(p, m, phase_max, phase_ub, sparse_dist, use)
    # implied cuts that tighten the relaxation: the rank holding a table's (largest) shard carries
    # at least the load every rank carries plus that shard's own extra load
    for i in range(len(PHASES)):
        for extra in parts.single[i].values():
            m.add(phase_max[i] >= shared[i] + fixed_cost[i] + sum(extra))
    buffer = int(math.ceil(p.pipeline_buffer_bytes))
    for q in range(W):
        h = q // L
        hbm_load, ddr_load = (
            sum(parts.uniform[i]) + sum(parts.host_part[h][i]) + sum(parts.own_part[q][i])
            for i in (HBM_COL, DDR_COL)
        )
        _add_memory_caps(
            p,
            m,
            hbm_load,
            ddr_load,
            sparse_dist,
            buffer=buffer,
            hbm_cap=p.hbm_cap,
            ddr_cap=p.ddr_cap,
            name=str(q),
        )
    return CpModelVars(m, use, place, sparse_dist, p.coeffs.dense_step_s, decomposed=False)


# ------------------------------------------------------------------------------------ aggregate
def build_aggregate(p: Problem) -> CpModelVars:
    """The decomposed formulation's first stage: every table's class against the average rank.

    Args:
        p: the problem.
    Returns:
        The model and its `use` variables (no placement), without a warm start.
    """
    W, L = p.topo.world_size, p.topo.local_world_size
    nph = len(PHASES)
    m = cp_model.CpModel()
    use: UseVars = {
        (s.name, c): m.new_bool_var(f"use[{s.name}|{c.label}]")
        for s in p.tables
        for c in p.classes[s.name]
    }
    fixed_cost, sparse_dist = _classes_and_fixed_costs(p, m, use)
    summed: list[list[Any]] = [[] for _ in range(LOAD_WIDTH)]  # Σ_ranks load (÷ W below)
    load_ub = [0.0] * LOAD_WIDTH
    single: list[list[tuple[str, int, cp_model.IntVar]]] = [[] for _ in range(nph)]
    for s in p.tables:
        worst = [0.0] * LOAD_WIDTH
        for c in p.classes[s.name]:
            terms = p.terms(s.name, c)
            v = use[s.name, c]
            total = load_over_ranks(terms, c, W, L)
            for i in range(LOAD_WIDTH):
                scale = NS if i < nph else 1
                tot = total[i]
                summed[i].append(int(round(tot * scale)) * v)
                worst[i] = max(worst[i], tot * scale)
                if i < nph and terms.located != "all" and terms.own[i] * W > tot:
                    single[i].append((s.name, _ns(terms.own[i]), v))
        for i in range(LOAD_WIDTH):
            load_ub[i] += worst[i]
    phase_ub = _phase_upper_bounds(p, load_ub, len(use))
    # phase_max·W ≥ Σ_ranks load  ⇔  phase_max ≥ the average rank's load; ·W keeps it integral
    phase_max = _new_phase_max(m, phase_ub)
    for i in range(nph):
        m.add(W * phase_max[i] >= sum(summed[i]) + W * fixed_cost[i])
        # a phase's max is at least the largest single shard's own load: one expression per table
        # (its classes are one-hot, so Σ_class own·use is the chosen shard's own load)
        per_table: dict[str, list[Any]] = {}
        for name, coef, v in single[i]:
            per_table.setdefault(name, []).append(coef * v)
        for own_load in per_table.values():
            m.add(phase_max[i] >= sum(own_load))
    _minimize_step(p, m, phase_max, phase_ub, sparse_dist, use)
    buffer = int(math.ceil(p.pipeline_buffer_bytes))
    _add_memory_caps(
        p,
        m,
        sum(summed[HBM_COL]),
        sum(summed[DDR_COL]),
        sparse_dist,
        buffer=W * buffer,
        hbm_cap=int(AGGREGATE_MEMORY_SHARE * W * p.hbm_cap),
        ddr_cap=int(AGGREGATE_MEMORY_SHARE * W * p.ddr_cap),
    )
    return CpModelVars(m, use, {}, sparse_dist, p.coeffs.dense_step_s, decomposed=True)
