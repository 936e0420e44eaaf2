"""A plan's statistics digest: its fields, and the checks the schema cannot make of it.

The digest is the table statistics a plan was made from, per table (`Plan.statistics`;
`sparselift.optimizer.planio.statistics_digest` writes it), what `sparselift plan check` compares a
new profile with.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `plan.py` calls this check; importing it here would close a circle
    from sparselift.plans.plan import Plan

# The fields of one table's entry in a plan's statistics digest (the file sorts them by name).
STATISTICS_FIELDS = ("ids_per_step", "unique_ratio", "pooling", "hot_share")


def statistics_problems(plan: Plan) -> list[str]:
    """What the schema cannot say about a plan's statistics digest: every value finite (JSON
    readers accept NaN and Infinity), one entry per model table and none for another table.

    Returns:
        One message per problem, each naming the table; [] for a plan without a digest.
    """
    if plan.statistics is None:
        return []
    names = [t.name for t in plan.model]
    known = set(names)
    problems = [
        f"statistics.{name}: no such table in the model"
        for name in plan.statistics
        if name not in known
    ]
    problems += [f"statistics: no entry for table {n!r}" for n in names if n not in plan.statistics]
    for name, values in plan.statistics.items():
        for key in STATISTICS_FIELDS:
            v = values.get(key)
            if isinstance(v, float) and not math.isfinite(v):
                problems.append(f"statistics.{name}.{key}: {v} is not a finite number")
    return problems
