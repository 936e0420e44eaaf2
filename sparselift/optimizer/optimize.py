"""One planning run: inputs → feasible options → global choices → CP-SAT → plan (never worse than
TorchRec's under our model) with its predicted costs and the solver's record."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparselift import plans
from sparselift.errors import UserError
from sparselift.optimizer.calibration import Coefficients
from sparselift.optimizer.cost_model import DDR, HBM, CostModel, Globals, PlanCost
from sparselift.optimizer.planio import choices_from_plan, to_plan
from sparselift.optimizer.solver import Problem, Solution, solve
from sparselift.optimizer.space import OptionClass, enumerate_classes
from sparselift.optimizer.stats import TableStats
from sparselift.optimizer.topology import Topology


@dataclass
class Inputs:
    stats: list[TableStats]
    topo: Topology
    batch_size: int  # per rank
    coeffs: Coefficients
    provenance: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    plan: plans.Plan
    cost: PlanCost
    solution: Solution
    baseline: plans.Plan | None
    baseline_cost: PlanCost | None
    kept_baseline: bool


def choose_precision(model: CostModel) -> Globals:
    """fp16 forward / bf16 backward where halving the bytes saves more than (de)quantizing costs.

    Per fp32 byte sent, 16-bit saves half its wire time w/2 and costs q/2 (q: seconds per element
    quantized, at both ends): a plan-independent comparison (both scale with the same bytes), so it
    is decided before the solve. w is the bytes' link: inside the host on one host (never more than
    the call's whole per-byte cost; host work per byte is not halved), the network otherwise.
    Gloo has no bf16 collectives (TorchRec falls back to fp16 there), so a CPU plan says fp16.
    """
    k, multi = model.coeffs, model.topo.num_hosts > 1
    half_bwd = "bf16" if model.topo.device == "cuda" else "fp16"

    def pays(b_intra: float) -> bool:
        wire = k.inter_host_b_s if multi else min(b_intra, k.wire_b_s)
        return k.quantize_b_s < wire

    return Globals(
        forward="fp16" if pays(k.output_dist_fwd.b_s) else "fp32",
        backward=half_bwd if pays(k.output_dist_bwd.b_s) else "fp32",
    )


def feasible_classes(
    model: CostModel, stats: list[TableStats], g: Globals
) -> dict[str, list[OptionClass]]:
    """Each table's classes whose own per-rank memory fits; one clear refusal when some table has none."""
    topo = model.topo
    hbm_cap, ddr_cap = topo.usable(topo.hbm_bytes), topo.usable(topo.ddr_bytes)
    out, stuck = {}, []
    for s in stats:
        ok = []
        for c in enumerate_classes(s, topo, model.batch_size):
            own = model.terms(s, c, g).own
            if (
                own[HBM] <= (hbm_cap if topo.device == "cuda" else float("inf"))
                and own[DDR] <= ddr_cap
            ):
                ok.append(c)
        if not ok:
            stuck.append(s)
        out[s.name] = ok
    total = sum(s.num_embeddings * s.embedding_dim * 4 + s.num_embeddings * 4 for s in stats)
    cap_total = topo.world_size * (
        hbm_cap + (ddr_cap if topo.has_uvm or topo.device == "cpu" else 0)
    )
    if stuck or total > cap_total:
        big = sorted(stats, key=lambda s: -s.num_embeddings * s.embedding_dim)[:3]
        mem = "HBM" if topo.device == "cuda" else "memory"
        per = hbm_cap if topo.device == "cuda" else ddr_cap
        raise UserError(
            f"the tables do not fit: weights + optimizer state need {_gib(total)} "
            f"({', '.join(stuck_names(stuck)) + ' cannot be placed; ' if stuck else ''}"
            f"usable {mem} is {_gib(per)} per rank × {topo.world_size} ranks = {_gib(per * topo.world_size)}"
            f"{' + host memory for UVM caching' if topo.has_uvm else ''}); largest tables: "
            + ", ".join(
                f"{s.name} {_gib(s.num_embeddings * (s.embedding_dim + 1) * 4)}" for s in big
            )
        )
    return out


def stuck_names(stuck: list[TableStats]) -> list[str]:
    return [s.name for s in stuck[:5]] + ([f"… {len(stuck) - 5} more"] if len(stuck) > 5 else [])


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


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
) -> Result:
    """Solve, then keep the baseline (TorchRec's plan) unless ours is predicted faster by `min_gain`.

    `min_gain` is the share by which a new plan must beat the baseline under the model to be worth
    the change: below the model's own prediction error, a "better" plan is a coin toss.
    """
    if not inp.stats:
        raise UserError("the workload has no tables")
    model = CostModel(inp.topo, inp.batch_size, inp.coeffs)
    g = choose_precision(model)
    classes = feasible_classes(model, inp.stats, g)
    by_name = {s.name: s for s in inp.stats}
    hint, base_cost = None, None
    for candidate in (baseline, *other_baselines):  # the cheapest TorchRec plan is the one to beat
        if candidate is None:
            continue
        choices, bg = choices_from_plan(candidate, inp.topo)
        cost = model.evaluate(by_name, choices, bg)
        if base_cost is None or cost.step_time_s < base_cost.step_time_s:
            hint, base_cost, baseline = choices, cost, candidate
    t0 = time.perf_counter()
    sol = solve(
        Problem(inp.stats, model, g, classes, hint),
        time_limit_s=time_limit_s,
        seed=seed,
        workers=workers,
        mode=mode,
        progress=progress,
    )
    g = Globals(g.forward, g.backward, sol.pipeline)
    choices = sol.choices
    cost = model.evaluate(by_name, choices, g)
    kept = False
    if (
        base_cost is not None
        and base_cost.step_time_s < cost.step_time_s * (1.0 + min_gain)
        and _fits(inp.topo, base_cost)
    ):
        # a decomposed or timed-out solve can land above the warm start: never hand back worse;
        # and a gain smaller than the model can resolve is not worth a new plan
        choices, g, cost, kept = hint, base_cost.globals, base_cost, True
    gap = (
        max(0.0, (cost.step_time_s - sol.bound_s) / cost.step_time_s)
        if cost.step_time_s > 0
        else 0.0
    )
    solver_rec = {
        "name": f"cp-sat ({sol.mode})",
        "status": sol.status + (" (torchrec plan kept)" if kept else ""),
        "objective": cost.step_time_s,
        "bound": min(sol.bound_s, cost.step_time_s),
        "gap": gap,
        "time_s": round(sol.det_time_s, 3),
        "seed": seed,
        "workers": workers,
    }
    provenance = {
        **inp.provenance,
        "coefficients": inp.coeffs.source,
        "batch_size": inp.batch_size,
        "tool": "sparselift optimize",
    }
    if kept:  # TorchRec's plan as it is (its table-column-wise splits too), with our records
        plan = dataclasses.replace(
            baseline, predicted=cost.predicted(), solver=solver_rec, provenance=provenance
        )
    else:
        plan = to_plan(
            inp.stats,
            choices,
            inp.topo,
            g,
            predicted=cost.predicted(),
            solver=solver_rec,
            provenance=provenance,
        )
    sol.wall_s = time.perf_counter() - t0
    return Result(plan, cost, sol, baseline, base_cost, kept)


def _fits(topo: Topology, cost: PlanCost) -> bool:
    hbm, ddr = topo.usable(topo.hbm_bytes), topo.usable(topo.ddr_bytes)
    return all(
        (r["hbm_bytes"] <= hbm or topo.device != "cuda") and r["ddr_bytes"] <= ddr
        for r in cost.per_rank
    )
