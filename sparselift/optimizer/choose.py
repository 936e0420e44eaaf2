"""Two choices `optimize` makes around the solve: the comm precision (before it) and the
baseline to beat and start from (the cheapest plan given, resolved when the solver asks)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from sparselift import plans
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PlanCost
from sparselift.optimizer.planio import choices_from_plan
from sparselift.optimizer.space import Choice, PlanWide
from sparselift.optimizer.split_options import plan_tables
from sparselift.optimizer.table_stats import TableStats
from sparselift.profiler.hot_ids import HotIds

PendingBaselines = Callable[[], Sequence[plans.Plan | None]]


def choose_precision(model: CostModel) -> PlanWide:
    """fp16 forward / bf16 backward where halving the bytes saves more than (de)quantizing costs.

    Per fp32 byte sent, 16-bit saves half its wire time w/2 and costs q/2 (q: seconds per element
    quantized, at both ends): a plan-independent comparison (both scale with the same bytes), so it
    is decided before the solve. w is the bytes' link: inside the host on one host (never more than
    the call's whole per-byte cost; host work per byte is not halved), the network otherwise.
    Gloo has no bf16 collectives (TorchRec falls back to fp16 there), so a CPU plan says fp16.
    One precision serves every output collective, so on one host 16-bit must pay on the
    all-to-all and, where a profile measured it, on the reduce-scatter of row-wise tables too
    (unmeasured, that one stands in at the all-to-all's cost and adds no verdict of its own).
    Where a profile measured 16 bits' net cost per element on one host (`qcomm_net_s`, over all
    its output collectives), that net decides both directions there: they pay where it is a
    saving.

    Returns:
        The collective precision (pipeline "base": the solver decides it).
    """
    coeffs, multi = model.coeffs, model.topo.num_hosts > 1
    half_bwd = "bf16" if model.topo.device == "cuda" else "fp16"

    def pays(a2a: str, rs: str) -> bool:
        if multi:
            return coeffs.quantize_b_s < coeffs.inter_host_b_s
        if coeffs.qcomm_net_s is not None:
            return coeffs.qcomm_net_s < 0.0
        kinds = [a2a, rs] if coeffs.measured(rs) else [a2a]
        per_byte = min(getattr(coeffs, k).b_s for k in kinds)
        return coeffs.quantize_b_s < min(per_byte, coeffs.wire_b_s)

    return PlanWide(
        forward="fp16" if pays("output_dist_fwd", "output_dist_rs_fwd") else "fp32",
        backward=half_bwd if pays("output_dist_bwd", "output_dist_rs_bwd") else "fp32",
    )


class CheapestBaseline:
    """The baseline to beat: the cheapest given plan under `model` (the objective the solve
    minimizes: set before the first call), chosen once all are there; every plan given is kept
    in `candidates`.

    Called as the solver's warm start, so that plans still being made (TorchRec's planner in
    child processes) are waited for only once the first CP-SAT model is built.
    """

    def __init__(
        self,
        model: CostModel,
        by_name: dict[str, TableStats],
        given: Sequence[plans.Plan | None],
        pending: PendingBaselines | None,
        hot: dict[str, HotIds] | None = None,
    ) -> None:
        self.model, self.by_name, self.given, self.pending = model, by_name, given, pending
        self.hot = hot  # measured hot ids: what a given plan's splits are priced by
        self.resolved, self.waited_s = False, 0.0
        self.plan: plans.Plan | None = None
        self.choices: dict[str, Choice] | None = None
        self.cost: PlanCost | None = None
        self.candidates: list[tuple[plans.Plan, dict[str, Choice], PlanWide]] = []

    def __call__(self) -> dict[str, Choice] | None:
        if not self.resolved:
            t0 = time.perf_counter()
            candidates = [*self.given, *(self.pending() if self.pending is not None else ())]
            self.waited_s = time.perf_counter() - t0
            for candidate in candidates:  # ties: the first given
                if candidate is None:
                    continue
                choices, plan_wide = choices_from_plan(candidate, self.model.topo)
                self.candidates.append((candidate, choices, plan_wide))
                stats = list(self.by_name.values())
                tables = {**self.by_name, **plan_tables(candidate, stats, self.hot)}
                cost = self.model.evaluate(tables, choices, plan_wide)
                if self.cost is None or cost.step_time_s < self.cost.step_time_s:
                    self.choices, self.cost, self.plan = choices, cost, candidate
            self.resolved = True
        return self.choices
