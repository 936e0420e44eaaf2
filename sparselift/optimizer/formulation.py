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

Both share the class structure and fixed per-call costs, the step objective and the memory
constraints (`formulation_shared`), and the warm start (`add_warm_start`, here). Variables and
constraints are created in a fixed order: CP-SAT's search, hence the plan, depends on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model

from sparselift.optimizer.costs import DDR_COL, HBM_COL, LOAD_WIDTH, PHASES
from sparselift.optimizer.formulation_shared import (
    PlaceVars,
    UseVars,
    add_memory_caps,
    classes_and_fixed_costs,
    minimize_step,
    new_phase_max,
    phase_upper_bounds,
    to_ns,
)
from sparselift.optimizer.placement import cheapest_average
from sparselift.optimizer.problem import NS, Problem, load_over_ranks
from sparselift.optimizer.space import Choice

AGGREGATE_MEMORY_SHARE = 0.95  # of the total capacity, the rest kept for the placement


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
    fixed_cost, sparse_dist = classes_and_fixed_costs(p, m, use)
    parts = _exact_load_parts(p, use, place)
    phase_ub = phase_upper_bounds(p, parts.load_ub, len(use))
    shared = []
    for i in range(len(PHASES)):
        sv = m.new_int_var(0, int(parts.load_ub[i]) + 1, f"uniform_load[{PHASES[i]}]")
        m.add(sv == sum(parts.uniform[i]))
        shared.append(sv)
    phase_max = new_phase_max(m, phase_ub)
    work: list[Any] = []  # every rank's load in every phase (`minimize_step`, crowded hosts)
    for q in range(W):
        h = q // L
        rank_load = [
            shared[i] + sum(parts.host_part[h][i]) + sum(parts.own_part[q][i]) + fixed_cost[i]
            for i in range(len(PHASES))
        ]
        for i in range(len(PHASES)):
            m.add(phase_max[i] >= rank_load[i])
        work += rank_load
    work_total = sum(work) if p.coeffs.crowd_factor > 0 else 0
    minimize_step(p, m, phase_max, phase_ub, sparse_dist, use, work_total)
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
        add_memory_caps(
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
    fixed_cost, sparse_dist = classes_and_fixed_costs(p, m, use)
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
                    single[i].append((s.name, to_ns(terms.own[i]), v))
        for i in range(LOAD_WIDTH):
            load_ub[i] += worst[i]
    phase_ub = phase_upper_bounds(p, load_ub, len(use))
    # phase_max·W ≥ Σ_ranks load  ⇔  phase_max ≥ the average rank's load; ·W keeps it integral
    phase_max = new_phase_max(m, phase_ub)
    for i in range(nph):
        m.add(W * phase_max[i] >= sum(summed[i]) + W * fixed_cost[i])
        # a phase's max is at least the largest single shard's own load: one expression per table
        # (its classes are one-hot, so Σ_class own·use is the chosen shard's own load)
        per_table: dict[str, list[Any]] = {}
        for name, coef, v in single[i]:
            per_table.setdefault(name, []).append(coef * v)
        for own_load in per_table.values():
            m.add(phase_max[i] >= sum(own_load))
    work_total = (
        sum(sum(summed[i]) + W * fixed_cost[i] for i in range(nph))
        if p.coeffs.crowd_factor > 0
        else 0
    )
    minimize_step(p, m, phase_max, phase_ub, sparse_dist, use, work_total)
    buffer = int(math.ceil(p.pipeline_buffer_bytes))
    add_memory_caps(
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
