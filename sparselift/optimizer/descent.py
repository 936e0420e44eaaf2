"""A descent over whole decisions: one table's class and placement at a time, while the step
drops; then the shards' local search (`placement.improve_placement`).

Why: the solver decomposes large models (classes against the average rank, then placement), and
its relaxation prices a placed class at the average rank's load. An objective with a max over
ranks of one model's whole verdict (what-if planning's two-model objective, `whatif`) is where
that average is furthest from the placed plan, and a decomposed solve can end above its own warm
start. Re-deciding one table at a time against the loads of all the others prices every
candidate exactly. It never raises the objective, keeps every rank's memory within its caps, and
is deterministic (fixed orders, the first of equals).

Each candidate is scored from the per-rank loads of every other table (an array), in O(ranks)
per placement: for a table-wise or column-wise shard, every rank at once; for a table-row-wise
table, every host; for a replicated or row-wise table, the one placement there is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from sparselift.optimizer.cost_model import Group, group_of
from sparselift.optimizer.costs import DDR_COL, HBM_COL, PHASES
from sparselift.optimizer.placement import improve_placement
from sparselift.optimizer.problem import Problem
from sparselift.optimizer.space import Choice, OptionClass

NPH = len(PHASES)
MAX_PASSES = 4  # passes over the tables at most (each pass tries every table once)
REL_GAIN = 1e-9  # a move must lower the step by more than this share


def _contribution(p: Problem, name: str, ch: Choice) -> np.ndarray:
    """Every rank's load (ranks × load columns) from table `name` under `ch` (as
    `cost_model.sum_rank_loads` adds it, with arrays)."""
    topo = p.topo
    t = p.terms(name, ch.cls)
    own, intra, inter = (np.array(x, dtype=float) for x in (t.own, t.remote_intra, t.remote_inter))
    if t.located == "all":
        return np.tile(own, (topo.world_size, 1))
    host = np.arange(topo.world_size) // topo.local_world_size
    if t.located == "host":
        out = np.tile(inter, (topo.world_size, 1))
        out[host == ch.host] = own
        return out
    out = np.zeros((topo.world_size, len(own)))
    for r in ch.ranks:
        out += inter
        out[host == host[r]] += intra - inter
        out[r] += own - intra
    return out


def _top2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of `x` (rows × columns): the largest value, its row (the first of equals)
    and the second largest value (0 with one row)."""
    top = np.argsort(-x, axis=0, kind="stable")[:2]
    cols = np.arange(x.shape[1])
    second = x[top[1], cols] if len(x) > 1 else np.zeros(x.shape[1])
    return x[top[0], cols], top[0], second


class _State:
    """The plan being improved: every rank's load and the groups (`cost_model.Group`) in use."""

    def __init__(self, p: Problem, choices: Mapping[str, Choice]) -> None:
        self.p = p
        self.choices = dict(choices)
        self.loads = np.array(p.rank_loads(self.choices), dtype=float)
        self.groups = Counter(group_of(p.by_name[n], ch.cls) for n, ch in self.choices.items())
        gpu = p.on_gpu
        self.caps = np.array([p.hbm_cap if gpu else np.inf, p.ddr_cap], dtype=float)
        self._fixed: dict[frozenset[Group], float] = {}

    def fixed_s(self, present: frozenset[Group]) -> float:
        """Fixed per-call costs of the groups `present` (seconds, cached)."""
        if present not in self._fixed:
            self._fixed[present] = float(sum(self.p.model.fixed_call_costs(present)))
        return self._fixed[present]

    def step_s(self) -> float:
        """The objective of the current plan (pipeline base)."""
        present = frozenset(g for g, k in self.groups.items() if k > 0)
        phases = self.loads[:, :NPH].max(axis=0).sum()
        return self.p.coeffs.dense_step_s + float(phases) + self.fixed_s(present)


def _best_for(st: _State, name: str) -> tuple[float, Choice, np.ndarray] | None:
    """The cheapest (step, choice, loads) of table `name` over its classes and placements, the
    other tables as they are; None if none fits memory."""
    p = st.p
    cur = st.choices[name]
    rest = st.loads - _contribution(p, name, cur)
    others = Counter(st.groups)
    others[group_of(p.by_name[name], cur.cls)] -= 1
    best: tuple[float, Choice, np.ndarray] | None = None
    for c in p.classes[name]:
        g = group_of(p.by_name[name], c)
        present = frozenset(x for x, k in others.items() if k > 0) | {g}
        base = p.coeffs.dense_step_s + st.fixed_s(present)
        for ch, loads in _placements(p, st, name, c, rest):
            if (loads[:, [HBM_COL, DDR_COL]] > st.caps).any():
                continue
            step = base + float(loads[:, :NPH].max(axis=0).sum())
            if best is None or step < best[0]:
                best = (step, ch, loads)
    return best


def _placements(
    p: Problem, st: _State, name: str, c: OptionClass, rest: np.ndarray
) -> list[tuple[Choice, np.ndarray]]:
    """Candidate placements of table `name` under class `c` on top of `rest`, with the loads
    each leaves: the one placement of a replicated / row-wise class, every host of a
    table-row-wise one, and for rank-placed shards a greedy placement (each shard where it
    raises the step least, the lowest rank of equals)."""
    if c.located == "all":
        ch = Choice(c)
        return [(ch, rest + _contribution(p, name, ch))]
    if c.located == "host":
        return _host_placements(p, st, name, c, rest)
    terms = p.terms(name, c)
    own = np.array(terms.own, dtype=float)
    if any(terms.remote_intra) or any(terms.remote_inter):  # not so today: priced exactly
        return _placements_exact(p, name, c, rest)
    loads, ranks = rest.copy(), list[int]()
    for _ in range(c.shards):
        # the shard on rank r changes row r alone: each phase's max is max(the others', row r's)
        ph = loads[:, :NPH]
        first, at, second = _top2(ph)
        rows = np.arange(len(ph))[:, None]
        others = np.where(rows == at[None, :], second[None, :], first[None, :])
        step = np.maximum(others, ph + own[None, :NPH]).sum(axis=1)
        mem = loads[:, [HBM_COL, DDR_COL]] + own[[HBM_COL, DDR_COL]]
        step[(mem > st.caps).any(axis=1)] = np.inf
        step[ranks] = np.inf
        r = int(np.argmin(step))
        if not np.isfinite(step[r]):
            return []
        ranks.append(r)
        loads[r] += own
    return [(Choice(c, ranks=tuple(sorted(ranks))), loads)]


def _host_placements(
    p: Problem, st: _State, name: str, c: OptionClass, rest: np.ndarray
) -> list[tuple[Choice, np.ndarray]]:
    """A table-row-wise class on the host where it raises the step least (the first of equals)
    and fits memory, with the loads it leaves: its own terms on the host's ranks, its
    other-host terms elsewhere; [] where no host fits."""
    topo = p.topo
    H, L = topo.num_hosts, topo.local_world_size
    t = p.terms(name, c)
    own, inter = np.array(t.own, dtype=float), np.array(t.remote_inter, dtype=float)
    inside, outside = rest + own, rest + inter  # every rank, as if on / off the host
    per_in = inside.reshape(H, L, -1).max(axis=1)  # hosts × columns
    per_out = outside.reshape(H, L, -1).max(axis=1)
    first, at, second = _top2(per_out)
    hosts = np.arange(H)[:, None]
    others = np.where(hosts == at[None, :], second[None, :], first[None, :])
    mem = [HBM_COL, DDR_COL]
    ok = ~(np.maximum(per_in[:, mem], others[:, mem]) > st.caps).any(axis=1)
    step = np.where(ok, np.maximum(per_in[:, :NPH], others[:, :NPH]).sum(axis=1), np.inf)
    h = int(np.argmin(step))  # the first of equals
    if not np.isfinite(step[h]):
        return []
    loads = outside.copy()
    loads[h * L : (h + 1) * L] = inside[h * L : (h + 1) * L]
    return [(Choice(c, host=h), loads)]


def _placements_exact(
    p: Problem, name: str, c: OptionClass, rest: np.ndarray
) -> list[tuple[Choice, np.ndarray]]:
    """The shards of a class whose terms also load other ranks, on the first ranks (a start the
    shards' local search does not move: such terms make their rank's load not its own)."""
    ch = Choice(c, ranks=tuple(range(c.shards)))
    return [(ch, rest + _contribution(p, name, ch))]


def descend(p: Problem, choices: Mapping[str, Choice]) -> dict[str, Choice]:
    """`choices` improved one table at a time (see the module), then, where a table moved, the
    shards' local search.

    Args:
        p: the problem (its terms are the objective; its classes the options; its caps memory).
        choices: a plan of every table of `p`, within its memory caps (pipeline base).
    Returns:
        Choices whose objective is at most that of `choices`.
    """
    st = _State(p, choices)
    order = sorted(
        (s.name for s in p.stats),
        key=lambda n: (-float(_contribution(p, n, st.choices[n])[:, :NPH].sum()), n),
    )
    changed = False
    for _ in range(MAX_PASSES):
        moved = False
        for name in order:
            now = st.step_s()
            best = _best_for(st, name)
            if best is None or best[1] == st.choices[name] or not best[0] < now * (1 - REL_GAIN):
                continue
            old = st.choices[name]
            st.groups[group_of(p.by_name[name], old.cls)] -= 1
            st.groups[group_of(p.by_name[name], best[1].cls)] += 1
            st.choices[name], st.loads = best[1], best[2]
            moved = changed = True
        if not moved:
            break
    return improve_placement(p, st.choices, "base") if changed else st.choices
