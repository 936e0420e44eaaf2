"""Any plan's predicted cost under SparseLift's model: what `analyze` and the benchmarks compare
measured steps with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparselift import plans
from sparselift.calibration import Calibration
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import Coefficients, coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PlanCost
from sparselift.optimizer.planio import choices_from_plan
from sparselift.optimizer.split_options import plan_tables
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.profiler.hot_ids import HotIds


def predict_plan(
    plan: plans.Plan | dict[str, Any] | str,
    stats: list[TableStats],
    calibration: Calibration | Mapping[str, Any] | Coefficients | None,
    topology: Topology,
    batch_size: int | None = None,
    hot: dict[str, HotIds] | None = None,
) -> PlanCost:
    """Per-rank costs and step time of a plan under SparseLift's cost model.

    Args:
        plan: a Plan, a plan dict or a plan file's path.
        stats: statistics of (at least) every table of the plan.
        calibration: a Calibration, calibration.json's object, Coefficients, or None (the
            topology preset's coefficients).
        topology: the topology to price on.
        batch_size: samples per rank; default the calibration's, else 512.
        hot: measured hot ids per table, which price a plan's hot/cold splits (else each
            table's skew curve does).
    Returns:
        The plan's PlanCost.
    Raises:
        UserError: the plan file is bad, or a plan table (or split table) has no statistics.
    """
    if not isinstance(plan, (dict, plans.Plan)):
        plan = plans.load(plan)
    coeffs = (
        calibration
        if isinstance(calibration, Coefficients)
        else coefficients(topology, calibration)
    )
    if batch_size is None:
        if isinstance(calibration, Calibration):
            batch_size = calibration.batch_size or 512
        elif isinstance(calibration, Mapping):
            batch_size = int(calibration.get("batch_size") or 512)
        else:
            batch_size = 512
    if isinstance(plan, dict):
        plan = plans.Plan.from_dict(plan)
    choices, g = choices_from_plan(plan, topology)
    by_name = plan_tables(plan, stats, hot)
    missing = [n for n in choices if n not in by_name]
    if missing:
        raise UserError(f"plan tables without statistics: {', '.join(missing)}")
    return CostModel(topology, batch_size, coeffs).evaluate(by_name, choices, g)
