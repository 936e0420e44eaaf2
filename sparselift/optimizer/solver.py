"""The CP-SAT formulation: choose every table's option (and its ranks) to minimize the step time.

Objective (see cost_model): dense + Σ_phase P_phase − hidden_input_dist + overhead·sparse_dist, with
P_phase ≥ the phase's load on every rank, hidden ≤ overlap·P_input_dist and hidden = 0 unless the
sparse-dist pipeline is chosen. Memory per rank (HBM and DDR) is a hard constraint. Times are
integer nanoseconds, memory integer bytes.

Two formulations, chosen by size (`mode="auto"`):

* **exact** (`build_exact`): booleans `use[table|class]` and, for shards placed on ranks,
  `place[table|class@rank]` (Σ_rank place = shards · use: a CW table's shards sit on distinct ranks,
  which removes the symmetry of identical shards) and `place[table|class@host]` for table-row-wise.
  Every rank's phase load is linear in them (own / same host / other host terms). Implied cuts —
  each phase's max ≥ the load every rank carries + one table's own shard load — give the relaxation
  what a single heavy table costs (without them a 2-rank multihot-26 plan ended at a 20 % gap; with
  them it is proved optimal in under a second). Optimal for the model; used when tables × classes ×
  ranks stays small (≤ EXACT_MAX_PLACEMENTS booleans); a time-limited solve is then polished by
  `improve_placement`.
* **decomposed** (`build_aggregate` + `place_greedy`): the table×rank×option cross product of
  1,000 tables × 128 ranks is millions of booleans, so CP-SAT first chooses only the *class* of
  every table against an aggregated load model — each phase's max ≥ the average rank's load (exact
  for replicated/row-wise terms, Σ shards · (own + (L−1)·same-host + (W−L)·other-host)/W for placed
  shards) and ≥ any single shard's own load; memory ≤ total capacity. That model is a relaxation,
  so its proven bound is a valid lower bound of the real optimum. Then shards are placed by LPT
  (largest first onto the rank that raises Σ_phase max least, memory permitting; ranks of a host are
  interchangeable, so ties go to the least loaded, then the lowest rank), and shard moves and swaps
  between ranks (`improve_placement`) repair what LPT leaves. The plan's objective is its true cost; the gap
  against the stage-1 bound is reported honestly.

`auto` runs the decomposed formulation first (30% of the time; it always yields a plan fast) and,
where the exact model is small enough, the exact one warm-started from the better of that plan and
TorchRec's (70%), keeping the better plan and the higher of the two valid bounds.

Determinism: fixed `random_seed`, `num_workers` (default 1) and a *deterministic* time limit
(`max_deterministic_time` = DET_SHARE × the limit), so the same inputs give the same plan; the wall
clock limit is the user's and only stops a slow machine (the status then ends in _WALL_LIMIT, and
that solve may not repeat exactly).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from sparselift.errors import UserError
from sparselift.optimizer.cost_model import (
    DDR,
    HBM,
    NV,
    PHASES,
    CostModel,
    Globals,
    Terms,
    group_of,
)
from sparselift.optimizer.space import DP, Choice, OptionClass
from sparselift.optimizer.stats import TableStats

NS = 1e9
EXACT_MAX_PLACEMENTS = 5_000
PPM = 1_000_000
# CP-SAT's deterministic time ran ~3.5× slower than the wall clock on the shared CPUs here; the
# deterministic limit is set to bind first so that a time-limited solve still repeats exactly.
DET_SHARE = 0.25
ID_PHASE = PHASES.index("input_dist")


@dataclass
class Problem:
    """Everything one solve needs; classes[table] lists the options still feasible for it."""

    stats: list[TableStats]
    model: CostModel
    globals: Globals  # precision decided before solving; pipeline decided by the solver
    classes: dict[str, list[OptionClass]]
    hint: dict[str, Choice] | None = None

    @property
    def topo(self):
        return self.model.topo

    def terms(self, name: str, c: OptionClass) -> Terms:
        return self.model.terms(self.by_name[name], c, self.globals)

    def __post_init__(self) -> None:
        self.by_name = {s.name: s for s in self.stats}


@dataclass
class Solution:
    choices: dict[str, Choice]
    pipeline: str
    status: str
    objective_s: float  # the solver's objective (model units → seconds)
    bound_s: float
    det_time_s: float
    wall_s: float
    mode: str
    seed: int
    workers: int


@dataclass
class Built:
    """A CP-SAT model and the variables to read the answer from, named after what they decide."""

    model: cp_model.CpModel
    use: dict[tuple[str, OptionClass], cp_model.IntVar]
    place: dict[tuple[str, OptionClass, int], cp_model.IntVar]  # rank (or host for TWRW)
    sparse_dist: cp_model.IntVar
    constant_s: float


def _ns(x: float) -> int:
    return int(round(x * NS))


def _caps(p: Problem) -> tuple[int, int]:
    t = p.topo
    return t.usable(t.hbm_bytes), t.usable(t.ddr_bytes)


def _common(p: Problem, m: cp_model.CpModel, use: dict) -> tuple[list, cp_model.IntVar, list]:
    """One-of per table, group-used booleans and their intercept expressions per phase."""
    for s in p.stats:
        m.AddExactlyOne([use[s.name, c] for c in p.classes[s.name]])
    groups: dict[tuple[str, str], cp_model.IntVar] = {}
    for (name, c), v in use.items():
        g = group_of(c)
        if g not in groups:
            groups[g] = m.NewBoolVar(f"group_used[{g[0]}/{g[1]}]")
        m.AddImplication(v, groups[g])
    types: dict[str, cp_model.IntVar] = {}
    for (st, _), gv in groups.items():
        if st != DP and st not in types:
            types[st] = m.NewBoolVar(f"a2a_used[{st}]")
        if st != DP:
            m.AddImplication(gv, types[st])
    k = p.model.coeffs
    icpt: list = [0] * len(PHASES)
    a_type = [k.input_dist.a_s, 0.0, k.output_dist_fwd.a_s, k.output_dist_bwd.a_s, 0.0, 0.0]
    a_group = [0.0, k.lookup_fwd.a_s, 0.0, 0.0, k.lookup_bwd.a_s, 0.0]
    for i in range(len(PHASES)):
        icpt[i] = sum(_ns(a_type[i]) * tv for tv in types.values()) + sum(
            _ns(a_group[i]) * gv for gv in groups.values()
        )
    dp = [gv for (st, _), gv in groups.items() if st == DP]
    if dp:
        icpt[PHASES.index("dp_allreduce")] += _ns((1 - k.dp_overlap) * k.dp_allreduce.a_s) * dp[0]
    sparse_dist = m.NewBoolVar("pipeline_sparse_dist")
    return icpt, sparse_dist, list(groups.values())


def _objective(
    p: Problem,
    m: cp_model.CpModel,
    phase_ub: list[int],
    row_exprs: Callable[[int], list],
    sparse_dist,
    n_rows: int,
) -> tuple[list, float]:
    """Phase max variables ≥ every row's expression; the objective; returns (P vars, constant)."""
    k = p.model.coeffs
    P = [m.NewIntVar(0, max(1, phase_ub[i]), f"phase_max[{ph}]") for i, ph in enumerate(PHASES)]
    for q in range(n_rows):
        exprs = row_exprs(q)
        for i in range(len(PHASES)):
            m.Add(P[i] >= exprs[i])
    hidden = m.NewIntVar(0, max(1, phase_ub[ID_PHASE]), "input_dist_hidden_by_sparse_dist")
    m.Add(hidden * PPM <= int(round(k.pipeline_overlap * PPM)) * P[ID_PHASE])
    m.Add(hidden <= max(1, phase_ub[ID_PHASE]) * sparse_dist)
    m.Minimize(sum(P) - hidden + _ns(k.pipeline_overhead_s) * sparse_dist)
    return P, k.dense_step_s


def _memory(
    p: Problem, m: cp_model.CpModel, exprs: list, sparse_dist, q: int, scale: int = 1
) -> None:
    hbm_cap, ddr_cap = _caps(p)
    buf = int(math.ceil(p.model.pipeline_buffer_bytes(p.stats)))
    gpu = p.topo.device == "cuda"
    m.Add(exprs[HBM] + (buf * sparse_dist if gpu else 0) <= hbm_cap * scale).WithName(f"hbm[{q}]")
    m.Add(exprs[DDR] + (0 if gpu else buf * sparse_dist) <= ddr_cap * scale).WithName(f"ddr[{q}]")


def placements(p: Problem) -> int:
    t = p.topo
    n = 0
    for s in p.stats:
        for c in p.classes[s.name]:
            n += (
                t.world_size if c.located == "rank" else (t.num_hosts if c.located == "host" else 1)
            )
    return n


# ------------------------------------------------------------------------------------------ exact
def build_exact(p: Problem) -> Built:
    topo = p.topo
    W, L, H = topo.world_size, topo.local_world_size, topo.num_hosts
    m = cp_model.CpModel()
    use, place = {}, {}
    for s in p.stats:
        for c in p.classes[s.name]:
            use[s.name, c] = v = m.NewBoolVar(f"use[{s.name}|{c.label}]")
            if c.located == "rank":
                zs = [m.NewBoolVar(f"place[{s.name}|{c.label}@rank{r}]") for r in range(W)]
                for r, z in enumerate(zs):
                    place[s.name, c, r] = z
                m.Add(sum(zs) == c.shards * v)
            elif c.located == "host":
                zs = [m.NewBoolVar(f"place[{s.name}|{c.label}@host{h}]") for h in range(H)]
                for h, z in enumerate(zs):
                    place[s.name, c, h] = z
                m.Add(sum(zs) == v)
    icpt, sparse_dist, _ = _common(p, m, use)

    # every rank's load: uniform part (same for all ranks) + host part + own part
    uniform = [[] for _ in range(NV)]
    host_part = [[[] for _ in range(NV)] for _ in range(H)]
    own_part = [[[] for _ in range(NV)] for _ in range(W)]
    ub = [0.0] * NV
    single: list[dict[str, list]] = [
        {} for _ in PHASES
    ]  # per phase and table: its shard rank's extra load
    for s in p.stats:
        worst = [0.0] * NV
        for c in p.classes[s.name]:
            tm = p.terms(s.name, c)
            v = use[s.name, c]
            scale = [NS] * len(PHASES) + [1, 1]
            if tm.located == "all":
                for i in range(NV):
                    uniform[i].append(int(round(tm.own[i] * scale[i])) * v)
            elif tm.located == "host":
                for i in range(NV):
                    uniform[i].append(int(round(tm.remote_inter[i] * scale[i])) * v)
                    d = int(round((tm.own[i] - tm.remote_inter[i]) * scale[i]))
                    if d > 0 and i < len(PHASES):
                        single[i].setdefault(s.name, []).append(d * v)
                    for h in range(H):
                        if d:
                            host_part[h][i].append(d * place[s.name, c, h])
            else:
                for i in range(NV):
                    uniform[i].append(int(round(c.shards * tm.remote_inter[i] * scale[i])) * v)
                    dh = int(round((tm.remote_intra[i] - tm.remote_inter[i]) * scale[i]))
                    do = int(round((tm.own[i] - tm.remote_intra[i]) * scale[i]))
                    extra = do + (
                        min(dh, 0) if H > 1 else 0
                    )  # the shard's rank, same-host terms included
                    if extra > 0 and i < len(PHASES):
                        single[i].setdefault(s.name, []).append(extra * v)
                    for r in range(W):
                        if dh and H > 1:
                            host_part[r // L][i].append(dh * place[s.name, c, r])
                        if do:
                            own_part[r][i].append(do * place[s.name, c, r])
                    if H == 1:  # every placed shard is on this host: fold the host term in
                        uniform[i].append(
                            int(
                                round(
                                    c.shards * (tm.remote_intra[i] - tm.remote_inter[i]) * scale[i]
                                )
                            )
                            * v
                        )
            for i in range(NV):
                worst[i] = max(
                    worst[i],
                    c.shards * max(tm.own[i], tm.remote_intra[i], tm.remote_inter[i]) * scale[i],
                )
        for i in range(NV):
            ub[i] += worst[i]
    shared = []
    for i in range(len(PHASES)):
        sv = m.NewIntVar(0, int(ub[i]) + 1, f"uniform_load[{PHASES[i]}]")
        m.Add(sv == sum(uniform[i]))
        shared.append(sv)
    k = p.model.coeffs
    a_ub = _ns(
        max(
            k.input_dist.a_s,
            k.lookup_fwd.a_s,
            k.output_dist_fwd.a_s,
            k.output_dist_bwd.a_s,
            k.lookup_bwd.a_s,
            k.dp_allreduce.a_s,
        )
    ) * (len(use) + 4)
    phase_ub = [int(ub[i]) + a_ub + 1 for i in range(len(PHASES))]

    def rank_exprs(q: int) -> list:
        h = q // L
        return [
            shared[i] + sum(host_part[h][i]) + sum(own_part[q][i]) + icpt[i]
            for i in range(len(PHASES))
        ]

    P, _ = _objective(p, m, phase_ub, rank_exprs, sparse_dist, W)
    # implied cuts that tighten the relaxation: the rank holding a table's (largest) shard carries at
    # least the load every rank carries plus that shard's own extra load
    for i in range(len(PHASES)):
        for terms in single[i].values():
            m.Add(P[i] >= shared[i] + icpt[i] + sum(terms))
    for q in range(W):
        h = q // L
        mem = [None] * NV
        for i in (HBM, DDR):
            mem[i] = sum(uniform[i]) + sum(host_part[h][i]) + sum(own_part[q][i])
        _memory(p, m, mem, sparse_dist, q)
    if p.hint:
        _add_hint(p, m, use, place, sparse_dist)
    return Built(m, use, place, sparse_dist, k.dense_step_s)


def _add_hint(p: Problem, m: cp_model.CpModel, use: dict, place: dict, sparse_dist) -> None:
    """TorchRec's plan as a warm start (only where its option is in our space)."""
    for s in p.stats:
        ch = p.hint.get(s.name)
        if ch is None or (s.name, ch.cls) not in use:
            continue
        for c in p.classes[s.name]:
            m.AddHint(use[s.name, c], c == ch.cls)
        if ch.cls.located == "rank":
            for r in range(p.topo.world_size):
                if (s.name, ch.cls, r) in place:
                    m.AddHint(place[s.name, ch.cls, r], r in ch.ranks)
        elif ch.cls.located == "host" and ch.host is not None:
            for h in range(p.topo.num_hosts):
                if (s.name, ch.cls, h) in place:
                    m.AddHint(place[s.name, ch.cls, h], h == ch.host)
    m.AddHint(sparse_dist, False)


def read_exact(p: Problem, b: Built, solver: cp_model.CpSolver) -> dict[str, Choice]:
    out = {}
    for s in p.stats:
        c = next(c for c in p.classes[s.name] if solver.Value(b.use[s.name, c]))
        if c.located == "rank":
            ranks = tuple(
                r for r in range(p.topo.world_size) if solver.Value(b.place[s.name, c, r])
            )
            out[s.name] = Choice(c, ranks=ranks)
        elif c.located == "host":
            out[s.name] = Choice(
                c,
                host=next(
                    h for h in range(p.topo.num_hosts) if solver.Value(b.place[s.name, c, h])
                ),
            )
        else:
            out[s.name] = Choice(c)
    return out


# ------------------------------------------------------------------------------------- decomposed
def build_aggregate(p: Problem) -> Built:
    topo = p.topo
    W, L = topo.world_size, topo.local_world_size
    m = cp_model.CpModel()
    use = {
        (s.name, c): m.NewBoolVar(f"use[{s.name}|{c.label}]")
        for s in p.stats
        for c in p.classes[s.name]
    }
    icpt, sparse_dist, _ = _common(p, m, use)
    avg = [[] for _ in range(NV)]  # Σ over ranks of the load, ×1 (divided by W below)
    ub = [0.0] * NV
    single: list[list] = [[] for _ in range(len(PHASES))]
    for s in p.stats:
        worst = [0.0] * NV
        for c in p.classes[s.name]:
            tm = p.terms(s.name, c)
            v = use[s.name, c]
            total = _over_ranks(tm, c, W, L)
            for i in range(NV):
                scale = NS if i < len(PHASES) else 1
                tot = total[i]
                avg[i].append(int(round(tot * scale)) * v)
                worst[i] = max(worst[i], tot * scale)
                if i < len(PHASES) and tm.located != "all" and tm.own[i] * W > tot:
                    single[i].append((s.name, _ns(tm.own[i]), v))
        for i in range(NV):
            ub[i] += worst[i]
    k = p.model.coeffs
    a_ub = _ns(
        max(
            k.input_dist.a_s,
            k.lookup_fwd.a_s,
            k.output_dist_fwd.a_s,
            k.output_dist_bwd.a_s,
            k.lookup_bwd.a_s,
            k.dp_allreduce.a_s,
        )
    ) * (len(use) + 4)
    phase_ub = [int(ub[i]) + a_ub + 1 for i in range(len(PHASES))]

    # P·W ≥ Σ_ranks load  ⇔  P ≥ the average rank's load; W on the left keeps it integral
    P = [m.NewIntVar(0, max(1, phase_ub[i]), f"phase_max[{ph}]") for i, ph in enumerate(PHASES)]
    for i in range(len(PHASES)):
        m.Add(W * P[i] >= sum(avg[i]) + W * icpt[i])
        # a phase's max is at least the largest single shard's own load: one expression per table
        # (its classes are one-hot, so Σ_class own·use is the chosen shard's own load)
        per_table: dict[str, list] = {}
        for name, coef, v in single[i]:
            per_table.setdefault(name, []).append(coef * v)
        for terms in per_table.values():
            m.Add(P[i] >= sum(terms))
    hidden = m.NewIntVar(0, max(1, phase_ub[ID_PHASE]), "input_dist_hidden_by_sparse_dist")
    m.Add(hidden * PPM <= int(round(k.pipeline_overlap * PPM)) * P[ID_PHASE])
    m.Add(hidden <= max(1, phase_ub[ID_PHASE]) * sparse_dist)
    m.Minimize(sum(P) - hidden + _ns(k.pipeline_overhead_s) * sparse_dist)
    hbm_cap, ddr_cap = _caps(p)
    buf = int(math.ceil(p.model.pipeline_buffer_bytes(p.stats)))
    gpu = topo.device == "cuda"
    # 5% of the total kept free for the placement's fragmentation
    m.Add(sum(avg[HBM]) + (W * buf * sparse_dist if gpu else 0) <= int(0.95 * W * hbm_cap))
    m.Add(sum(avg[DDR]) + (0 if gpu else W * buf * sparse_dist) <= int(0.95 * W * ddr_cap))
    if p.hint:
        _add_hint(p, m, use, {}, sparse_dist)
    else:  # without a warm start CP-SAT may spend its budget before a first solution: start it
        _add_hint(
            p.__class__(p.stats, p.model, p.globals, p.classes, cheapest_average(p)),
            m,
            use,
            {},
            sparse_dist,
        )
    return Built(m, use, {}, sparse_dist, k.dense_step_s)


def _over_ranks(tm: Terms, c: OptionClass, W: int, L: int) -> list[float]:
    """One table option's phase times and memory summed over all ranks."""
    if tm.located == "all":
        return [W * x for x in tm.own]
    if tm.located == "host":
        return [L * o + (W - L) * r for o, r in zip(tm.own, tm.remote_inter)]
    return [
        c.shards * (o + (L - 1) * ri + (W - L) * re)
        for o, ri, re in zip(tm.own, tm.remote_intra, tm.remote_inter)
    ]


def cheapest_average(p: Problem) -> dict[str, Choice]:
    """Each table's class with the least average per-rank time, memory-lightest first on ties."""
    topo = p.topo
    W, L = topo.world_size, topo.local_world_size
    out = {}
    for s in p.stats:

        def key(c: OptionClass) -> tuple:
            tot = _over_ranks(p.terms(s.name, c), c, W, L)
            return (sum(tot[: len(PHASES)]), tot[HBM] + tot[DDR], c)

        out[s.name] = Choice(min(p.classes[s.name], key=key))
    return out


def place_greedy(p: Problem, classes: Mapping[str, OptionClass]) -> dict[str, Choice]:
    """LPT placement of the placed shards (TW/CW shards on ranks, TWRW tables on hosts)."""
    topo = p.topo
    W, L, H = topo.world_size, topo.local_world_size, topo.num_hosts
    nph = len(PHASES)
    loads = np.zeros((W, NV))
    hbm_cap, ddr_cap = _caps(p)
    cap = np.array([hbm_cap if topo.device == "cuda" else np.inf, ddr_cap])
    pieces = []
    out: dict[str, Choice] = {}
    for s in p.stats:
        c = classes[s.name]
        tm = p.terms(s.name, c)
        own, ri, re = np.array(tm.own), np.array(tm.remote_intra), np.array(tm.remote_inter)
        if tm.located == "all":
            loads += own
            out[s.name] = Choice(c)
            continue
        loads += re * (c.shards if tm.located == "rank" else 1)
        weight = float(own[:nph].sum()) + float(own[HBM:].sum() / max(cap.min(), 1.0))
        for j in range(c.shards if tm.located == "rank" else 1):
            pieces.append((-weight, s.name, j, c, own, ri, re))
    pieces.sort(key=lambda x: (x[0], x[1], x[2]))
    taken: dict[str, list[int]] = {}
    for _, name, _, c, own, ri, re in pieces:
        curmax = loads[:, :nph].max(axis=0)
        norm = np.maximum(curmax, 1e-12)
        if c.located == "host":
            best = None
            for h in range(H):
                block = loads[h * L : (h + 1) * L] + (own - re)
                if (block[:, HBM:] > cap).any():
                    continue
                newmax = np.maximum(curmax, block[:, :nph].max(axis=0))
                key = (
                    round(float(newmax.sum()), 12),
                    round(float((block[:, :nph] / norm).sum()), 9),
                    h,
                )
                best = min(best, key) if best else key
            if best is None:
                raise UserError(f"table {name!r}: no host has memory left for {c.label}")
            h = best[2]
            loads[h * L : (h + 1) * L] += own - re
            out[name] = Choice(c, host=h)
            continue
        dh, do = ri - re, own - ri
        host_max = loads.reshape(H, L, NV)[:, :, :nph].max(axis=1) + dh[:nph]  # (H, nph)
        cand = loads + dh + do  # the owner's new load if placed on each rank
        newmax = np.maximum(np.maximum(curmax, host_max[np.arange(W) // L]), cand[:, :nph])
        score = newmax.sum(axis=1)
        balance = (cand[:, :nph] / norm).sum(axis=1)
        ok = (cand[:, HBM:] <= cap).all(axis=1)
        for r in taken.get(name, []):
            ok[r] = False
        if not ok.any():
            raise UserError(f"table {name!r}: no rank has memory left for a {c.label} shard")
        order = np.lexsort((np.arange(W), np.round(balance, 9), np.round(score, 12)))
        r = int(next(x for x in order if ok[x]))
        if H > 1:
            loads[(r // L) * L : (r // L + 1) * L] += dh
        else:
            loads += dh
        loads[r] += do
        taken.setdefault(name, []).append(r)
    for name, ranks in taken.items():
        out[name] = Choice(classes[name], ranks=tuple(sorted(ranks)))
    return out


def improve_placement(
    p: Problem, choices: Mapping[str, Choice], pipeline: str = "base", max_scans: int = 10
) -> dict[str, Choice]:
    """Local search over where rank-placed shards sit: move a shard to another rank, or swap it with
    a shard on another rank, while that lowers the step's Σ_phase max_rank load (input_dist weighted
    by what the pipeline leaves exposed), or keeps it and flattens the loads (Σ of squared phase
    loads, each phase scaled by its max) so that a later step can lower it. Once no step does, a
    second stage also takes steps that keep the step and lower the largest rank's Σ_phase load.

    That second key is the step where phases overlap instead of waiting on each other (the bound
    TorchRec's planner minimizes): of two plans equally fast in lockstep, the one also fast without
    it is the more robust. It comes second so that it never costs the first stage its step.

    LPT and a time-limited exact solve leave plateaus (the slowest rank of one phase is not the
    slowest of another) and packing waste (shards too large for the room left); moves repair the
    first, swaps the second. Each candidate is scored in O(phases) from the current top-3 ranks of
    every phase, vectorized over all ranks and shards, so a scan costs O(shards²) at any scale.
    Only shards whose table charges nothing to other ranks (table-wise, column-wise: see
    cost_model) move: their load is their rank's alone. Deterministic: fixed order, moves before
    swaps, lowest index on ties; at most `max_scans` passes over the shards a stage (at 1,000
    tables × 128 ranks a pass takes ~0.4 s and the first few bring nearly all of the gain).
    """
    topo = p.topo
    W, nph = topo.world_size, len(PHASES)
    g = Globals(p.globals.forward, p.globals.backward, pipeline)
    loads = np.array(p.model.rank_loads(p.by_name, choices, g))
    hbm_cap, ddr_cap = _caps(p)
    buf = p.model.pipeline_buffer_bytes(p.stats) if pipeline == "sparse-dist" else 0.0
    gpu = topo.device == "cuda"
    cap = np.array([hbm_cap - buf if gpu else np.inf, ddr_cap - (0.0 if gpu else buf)])
    movable = []  # (table, choice, own load): tables whose load is their shard ranks' alone
    for name in sorted(choices):
        ch = choices[name]
        tm = p.terms(name, ch.cls) if ch.cls.located == "rank" else None
        if tm is not None and not any(tm.remote_intra) and not any(tm.remote_inter):
            movable.append((name, ch, np.array(tm.own)))
    if not movable:
        return dict(choices)
    rows = sorted(
        (
            (-float(own[:nph].sum()), t, r)
            for t, (_, ch, own) in enumerate(movable)
            for r in ch.ranks
        )
    )
    tab = np.array([t for _, t, _ in rows])
    rank = np.array([r for _, _, r in rows])
    own = np.array([movable[t][2] for t in tab])
    occ = np.zeros((len(movable), W), dtype=bool)
    occ[tab, rank] = True
    wt = np.ones(nph)  # what a phase's max adds to the step: the pipeline hides part of input_dist
    if pipeline == "sparse-dist":
        wt[ID_PHASE] = 1.0 - p.model.coeffs.pipeline_overlap
    same = lambda x, c: x <= c * (1 + 1e-12)  # noqa: E731
    less = lambda x, c: x < c * (1 - 1e-9)  # noqa: E731
    for by_total in (False, True):  # flatten the loads first; then lower the largest rank total
        for _ in range(max_scans):
            changed = False
            for a in range(len(rows)):
                r, ta = rank[a], tab[a]
                ph = loads[:, :nph]
                phmax = ph.max(axis=0)
                norm = np.maximum(phmax, 1e-12)
                # candidates: move to rank q (nothing comes back), or swap with shard b on rank q
                sw = np.flatnonzero((rank != r) & (tab != ta))
                q = np.concatenate([np.arange(W), rank[sw]])
                back = np.vstack([np.zeros((W, own.shape[1])), own[sw]])
                ok = (q != r) & ~occ[ta, q]
                ok[W:] &= ~occ[tab[sw], r]
                new_r = loads[r] - own[a] + back
                new_q = loads[q] - back + own[a]
                ok &= (new_r[:, nph:] <= cap).all(axis=1) & (new_q[:, nph:] <= cap).all(axis=1)
                if not ok.any():
                    continue
                step = (wt * _max_after(ph, r, q, new_r[:, :nph], new_q[:, :nph])).sum(axis=1)
                dsq = (
                    wt
                    * (new_r[:, :nph] ** 2 - ph[r] ** 2 + new_q[:, :nph] ** 2 - ph[q] ** 2)
                    / norm**2
                ).sum(axis=1)
                cur_step, tot, cur_tot = (wt * phmax).sum(), np.zeros(len(q)), 0.0
                if by_total:
                    totals = ph @ wt
                    tot, cur_tot = (
                        _max_after(totals, r, q, new_r[:, :nph] @ wt, new_q[:, :nph] @ wt),
                        totals.max(),
                    )
                better = ok & (
                    less(step, cur_step)
                    | same(step, cur_step)
                    & (less(tot, cur_tot) | same(tot, cur_tot) & (dsq < -1e-9))
                )
                if not better.any():
                    continue
                k = int(
                    min(
                        np.flatnonzero(better),
                        key=lambda x: (
                            round(float(step[x]), 15),
                            round(float(tot[x]), 15),
                            round(float(dsq[x]), 12),
                            x,
                        ),
                    )
                )
                dest = int(q[k])
                loads[r] = new_r[k]
                loads[dest] = new_q[k]
                occ[ta, r], occ[ta, dest] = False, True
                rank[a] = dest
                if k >= W:
                    b = sw[k - W]
                    occ[tab[b], dest], occ[tab[b], r] = False, True
                    rank[b] = r
                changed = True
            if not changed:
                break
    out = dict(choices)
    for t, (name, ch, _) in enumerate(movable):
        out[name] = Choice(ch.cls, ranks=tuple(sorted(int(x) for x in rank[tab == t])))
    return out


def _max_after(
    vals: np.ndarray, r: int, q: np.ndarray, new_r: np.ndarray, new_q: np.ndarray
) -> np.ndarray:
    """Max over ranks of `vals` (ranks, or ranks × columns) once rank r takes `new_r` and rank q[i]
    takes `new_q[i]`, for every candidate i at once: from the top 3 ranks, only two of them change."""
    v = vals.reshape(len(vals), -1)
    top = np.argsort(-v, axis=0, kind="stable")[:3]
    topv = np.take_along_axis(v, top, axis=0)
    top = np.vstack([top, np.full((3 - len(top), v.shape[1]), -1)])
    topv = np.vstack([topv, np.zeros((3 - len(topv), v.shape[1]))])
    free = [(top[t][None, :] != r) & (top[t][None, :] != q[:, None]) for t in range(2)]
    others = np.where(free[0], topv[0], np.where(free[1], topv[1], topv[2]))
    out = np.maximum(others, np.maximum(new_r.reshape(len(q), -1), new_q.reshape(len(q), -1)))
    return out.reshape((len(q),) + vals.shape[1:])


# ------------------------------------------------------------------------------------------ solve
class Progress(cp_model.CpSolverSolutionCallback):
    """Prints each improving solution's objective and the proven bound while CP-SAT runs."""

    def __init__(self, constant_s: float, out: Callable[[str], None] | None) -> None:
        super().__init__()
        self.constant_s, self.out, self.n = constant_s, out, 0

    def on_solution_callback(self) -> None:
        self.n += 1
        if self.out:
            obj = self.ObjectiveValue() / NS + self.constant_s
            bound = self.BestObjectiveBound() / NS + self.constant_s
            self.out(
                f"  solution {self.n}: step {obj * 1e3:.3f} ms, bound {bound * 1e3:.3f} ms, "
                f"{self.WallTime():.1f} s"
            )


def solve(
    p: Problem,
    *,
    time_limit_s: float = 30.0,
    seed: int = 0,
    workers: int = 1,
    mode: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> Solution:
    """`auto`: decomposed first (fast, always finds a plan); where the exact model is small enough,
    then exact with the better of that plan and the caller's hint as warm start, keeping the better."""
    if mode != "auto":
        return solve_once(
            p, time_limit_s=time_limit_s, seed=seed, workers=workers, mode=mode, progress=progress
        )
    if placements(p) > EXACT_MAX_PLACEMENTS:
        return solve_once(
            p,
            time_limit_s=time_limit_s,
            seed=seed,
            workers=workers,
            mode="decomposed",
            progress=progress,
        )
    try:
        first = solve_once(
            p,
            time_limit_s=0.3 * time_limit_s,
            seed=seed,
            workers=workers,
            mode="decomposed",
            progress=progress,
        )
    except (
        UserError
    ):  # the decomposition's greedy placement or memory margin found no room: exact may
        return solve_once(
            p,
            time_limit_s=time_limit_s,
            seed=seed,
            workers=workers,
            mode="exact",
            progress=progress,
        )
    g = lambda s: Globals(p.globals.forward, p.globals.backward, s.pipeline)  # noqa: E731
    first_cost = p.model.evaluate(p.by_name, first.choices, g(first)).step_time_s
    hint = first.choices
    if p.hint is not None:
        hint_cost = p.model.evaluate(
            p.by_name, p.hint, Globals(p.globals.forward, p.globals.backward)
        ).step_time_s
        if all(ch.cls in p.classes[n] for n, ch in p.hint.items()) and hint_cost < first_cost:
            hint = p.hint
    try:
        exact = solve_once(
            Problem(p.stats, p.model, p.globals, p.classes, hint),
            time_limit_s=0.7 * time_limit_s,
            seed=seed,
            workers=workers,
            mode="exact",
            progress=progress,
        )
    except UserError:
        return first
    exact_cost = p.model.evaluate(p.by_name, exact.choices, g(exact)).step_time_s
    return exact if exact_cost <= first_cost else first


def solve_once(
    p: Problem,
    *,
    time_limit_s: float,
    seed: int,
    workers: int,
    mode: str,
    progress: Callable[[str], None] | None = None,
) -> Solution:
    """Build (exact or decomposed), solve deterministically, read the answer out into choices."""
    t0 = time.perf_counter()
    built = build_exact(p) if mode == "exact" else build_aggregate(p)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = seed
    prm.num_workers = workers
    prm.max_deterministic_time = DET_SHARE * float(time_limit_s)
    prm.max_time_in_seconds = float(time_limit_s)
    cb = Progress(built.constant_s, progress)
    status = solver.Solve(built.model, cb)
    name = solver.StatusName(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.INFEASIBLE:
            raise UserError("no plan fits the topology's memory with the available options")
        raise UserError(
            f"the solver found no plan within {time_limit_s:g} s (status {name}); raise --time-limit"
        )
    pipeline = "sparse-dist" if solver.Value(built.sparse_dist) else "base"
    if mode == "exact":
        choices = read_exact(p, built, solver)
        if name != "OPTIMAL":
            choices = improve_placement(p, choices, pipeline)
    else:
        classes = {
            s.name: next(c for c in p.classes[s.name] if solver.Value(built.use[s.name, c]))
            for s in p.stats
        }
        choices = improve_placement(p, place_greedy(p, classes), pipeline)
        name = (
            "FEASIBLE" if name == "OPTIMAL" else name
        )  # optimal for the relaxation, not the placement
    if solver.WallTime() >= prm.max_time_in_seconds - 0.5:
        name += "_WALL_LIMIT"
    return Solution(
        choices=choices,
        pipeline=pipeline,
        status=name,
        objective_s=solver.ObjectiveValue() / NS + built.constant_s,
        bound_s=solver.BestObjectiveBound() / NS + built.constant_s,
        det_time_s=solver.deterministic_time,
        wall_s=time.perf_counter() - t0,
        mode=mode,
        seed=seed,
        workers=workers,
    )
