"""Where shards go once their classes are chosen: a cheapest start, greedy LPT placement and a
local search over ranks.

Pure functions of a `Problem` (they read its term table, nothing else) and deterministic: fixed
orders, lowest index on ties.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from sparselift.errors import UserError
from sparselift.optimizer.costs import DDR_COL, HBM_COL, LOAD_WIDTH, PHASES
from sparselift.optimizer.problem import Problem, load_over_ranks
from sparselift.optimizer.space import Choice, OptionClass

ID_PHASE = PHASES.index("input_dist")


class _Piece(NamedTuple):
    """One thing LPT places: a rank-placed shard or a host-placed table, with its loads."""

    neg_weight: float  # −(its phase seconds + its memory share of a rank): sorts largest first
    table: str
    shard: int  # the shard's index within its table
    cls: OptionClass
    own: np.ndarray
    remote_intra: np.ndarray
    remote_inter: np.ndarray


def cheapest_average(p: Problem) -> dict[str, Choice]:
    """Each table's class with the least average per-rank time, memory-lightest first on ties
    (and for a table with splits, the way of running it whose classes so chosen cost least).

    The decomposed formulation's warm start when no plan is given: without one CP-SAT may spend
    its budget before a first solution. Placed classes come without ranks (a hint on classes).
    """
    topo = p.topo
    W, L = topo.world_size, topo.local_world_size

    def key(name: str, c: OptionClass) -> tuple[float, float]:
        total = load_over_ranks(p.terms(name, c), c, W, L)
        return (sum(total[: len(PHASES)]), total[HBM_COL] + total[DDR_COL])

    def cheapest(name: str) -> OptionClass:
        return min(p.classes[name], key=lambda c: (*key(name, c), c))

    out = {}
    for s in p.stats:
        best = {name: cheapest(name) for way in p.alternatives(s.name) for name in way}
        way = min(  # the model table itself on ties (listed first)
            p.alternatives(s.name),
            key=lambda w: tuple(map(sum, zip(*(key(n, best[n]) for n in w), strict=True))),
        )
        out.update({name: Choice(best[name]) for name in way})
    return out


def place_greedy(p: Problem, classes: Mapping[str, OptionClass]) -> dict[str, Choice]:
    """LPT placement: shards largest first, each where it raises Σ_phase max_rank load least.

    Table-wise and column-wise shards go onto ranks (a column-wise table's shards onto distinct
    ranks), table-row-wise tables onto hosts; replicated and row-wise tables load every rank.
    Ranks of a host are interchangeable, so ties go to the least loaded rank, then the lowest.

    Args:
        p: the problem (terms, memory caps).
        classes: the class chosen for every table run (a split table's parts, not itself).
    Returns:
        Their choices.
    Raises:
        UserError: a shard finds no rank (or host) with memory left for it.
    """
    topo = p.topo
    W, L, H = topo.world_size, topo.local_world_size, topo.num_hosts
    nph = len(PHASES)
    loads = np.zeros((W, LOAD_WIDTH))
    cap = np.array([p.hbm_cap if p.on_gpu else np.inf, p.ddr_cap])
    pieces: list[_Piece] = []
    out: dict[str, Choice] = {}
    for s in p.tables:
        if s.name not in classes:
            continue
        c = classes[s.name]
        terms = p.terms(s.name, c)
        own = np.array(terms.own)
        remote_intra, remote_inter = np.array(terms.remote_intra), np.array(terms.remote_inter)
        if terms.located == "all":
            loads += own
            out[s.name] = Choice(c)
            continue
        loads += remote_inter * (c.shards if terms.located == "rank" else 1)
        weight = float(own[:nph].sum()) + float(own[HBM_COL:].sum() / max(cap.min(), 1.0))
        for j in range(c.shards if terms.located == "rank" else 1):
            pieces.append(_Piece(-weight, s.name, j, c, own, remote_intra, remote_inter))
    pieces.sort(key=lambda x: (x.neg_weight, x.table, x.shard))
    taken: dict[str, list[int]] = {}
    for piece in pieces:
        name, c, own = piece.table, piece.cls, piece.own
        remote_intra, remote_inter = piece.remote_intra, piece.remote_inter
        curmax = loads[:, :nph].max(axis=0)
        norm = np.maximum(curmax, 1e-12)
        if c.located == "host":
            best = None
            for h in range(H):
                block = loads[h * L : (h + 1) * L] + (own - remote_inter)
                if (block[:, HBM_COL:] > cap).any():
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
            loads[h * L : (h + 1) * L] += own - remote_inter
            out[name] = Choice(c, host=h)
            continue
        dh, do = remote_intra - remote_inter, own - remote_intra
        host_max = loads.reshape(H, L, LOAD_WIDTH)[:, :, :nph].max(axis=1) + dh[:nph]  # (H, nph)
        cand = loads + dh + do  # the owner's new load if placed on each rank
        newmax = np.maximum(np.maximum(curmax, host_max[np.arange(W) // L]), cand[:, :nph])
        score = newmax.sum(axis=1)
        balance = (cand[:, :nph] / norm).sum(axis=1)
        ok = (cand[:, HBM_COL:] <= cap).all(axis=1)
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
    """Local search over the ranks of rank-placed shards: moves to another rank and swaps.

    A step is taken while it lowers the step's Σ_phase max_rank load (input_dist weighted by what
    the pipeline leaves exposed), or keeps it and flattens the loads (Σ of squared phase loads,
    each phase scaled by its max) so that a later step can lower it. Once no step does, a second
    stage also takes steps that keep the step and lower the largest rank's Σ_phase load: the
    step when phases overlap (the bound TorchRec's planner minimizes), so that of two plans
    equally fast in lockstep the more robust one is kept; second, so it never costs the step.

    Why: LPT and a time-limited exact solve leave plateaus (the slowest rank of one phase is not
    the slowest of another), which moves repair, and packing waste (shards too large for the
    room left), which swaps repair. Only shards of rank-placed tables (table-wise, column-wise)
    move, and only where what they charge other ranks does not depend on where they are (nothing,
    or on one host the same to every other rank): what moves is their rank's load beyond the
    others'. Each candidate is scored from the top-3 ranks of every phase, vectorized over ranks
    and shards.

    Args:
        p: the problem (terms, memory caps, coefficients).
        choices: every table's choice; only rank-placed shards move.
        pipeline: the plan's pipeline ("base" or "sparse-dist"): what is exposed, what fits.
        max_scans: passes over the shards per stage at most.
    Returns:
        The choices with the moved shards' ranks (classes unchanged; memory still fits).
    """
    W, nph = p.topo.world_size, len(PHASES)
    loads = np.array(p.rank_loads(choices))
    buf = p.pipeline_buffer_bytes if pipeline == "sparse-dist" else 0.0
    gpu = p.on_gpu
    cap = np.array([p.hbm_cap - buf if gpu else np.inf, p.ddr_cap - (0.0 if gpu else buf)])
    one_host = p.topo.num_hosts == 1
    movable = []  # (table, choice, what moves with a shard): its rank's load beyond the others'
    for name in sorted(choices):
        ch = choices[name]
        terms = p.terms(name, ch.cls) if ch.cls.located == "rank" else None
        if terms is None or any(terms.remote_inter) or not one_host and any(terms.remote_intra):
            continue
        movable.append((name, ch, np.array(terms.own) - np.array(terms.remote_intra)))
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
        wt[ID_PHASE] = 1.0 - p.coeffs.pipeline_overlap

    def same(x: Any, c: Any) -> Any:
        return x <= c * (1 + 1e-12)

    def less(x: Any, c: Any) -> Any:
        return x < c * (1 - 1e-9)

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
                best = int(
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
                dest = int(q[best])
                loads[r] = new_r[best]
                loads[dest] = new_q[best]
                occ[ta, r], occ[ta, dest] = False, True
                rank[a] = dest
                if best >= W:
                    b = sw[best - W]
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
    """Max over ranks of `vals` (ranks, or ranks × columns) once rank r takes `new_r` and rank
    q[i] takes `new_q[i]`, for every candidate i at once: from the top 3 ranks, as only two of
    them change."""
    v = vals.reshape(len(vals), -1)
    top = np.argsort(-v, axis=0, kind="stable")[:3]
    topv = np.take_along_axis(v, top, axis=0)
    top = np.vstack([top, np.full((3 - len(top), v.shape[1]), -1)])
    topv = np.vstack([topv, np.zeros((3 - len(topv), v.shape[1]))])
    free = [(top[t][None, :] != r) & (top[t][None, :] != q[:, None]) for t in range(2)]
    others = np.where(free[0], topv[0], np.where(free[1], topv[1], topv[2]))
    out = np.maximum(others, np.maximum(new_r.reshape(len(q), -1), new_q.reshape(len(q), -1)))
    return out.reshape((len(q),) + vals.shape[1:])
