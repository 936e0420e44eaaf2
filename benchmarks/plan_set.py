"""Plans one decision away from a given plan, for the benchmarks that measure the cost model's
decisions (bench_optimizer_neighbours.py, bench_prediction.py)."""

from __future__ import annotations

import dataclasses

from sparselift import plans
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PHASES
from sparselift.optimizer.planio import choices_from_plan, to_plan
from sparselift.optimizer.space import Choice, enumerate_classes
from sparselift.optimizer.split_options import options_of_plan, plan_tables
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import Topology
from sparselift.profiler.hot_ids import HotIds


def placements(cls, topo: Topology) -> list[Choice]:
    """Every way the model can place one option class (TW on any rank, CW on the first k ranks)."""
    if cls.located == "all":
        return [Choice(cls)]
    if cls.located == "host":
        return [Choice(cls, host=h) for h in range(topo.num_hosts)]
    if cls.shards == 1:
        return [Choice(cls, ranks=(r,)) for r in range(topo.world_size)]
    return [Choice(cls, ranks=tuple(range(cls.shards)))]


def neighbours(
    plan: plans.Plan,
    stats: list[TableStats],
    model: CostModel,
    hot: dict[str, HotIds] | None = None,
) -> list[tuple[str, plans.Plan]]:
    """One decision changed each: pipeline, comm precision, each sharding type's heaviest table
    (a split plan's parts are tables here; its splits stay); `hot`: the profile's hot ids, which
    price its hot/cold splits."""
    topo = model.topo
    by = plan_tables(plan, stats, hot)
    splits = options_of_plan(plan.splits, stats, hot)
    choices, g = choices_from_plan(plan, topo)

    def make(c, gg) -> plans.Plan:
        return to_plan(stats, c, topo, gg, module=plan.module, splits=splits)

    other = "base" if g.pipeline == "sparse-dist" else "sparse-dist"
    out = [(f"pipeline {other}", make(choices, dataclasses.replace(g, pipeline=other)))]
    if (g.forward, g.backward) == ("fp32", "fp32"):
        bwd = "bf16" if topo.device == "cuda" else "fp16"  # gloo has no bf16
        out.append(
            (
                f"comm fp16 fwd / {bwd} bwd",
                make(choices, dataclasses.replace(g, forward="fp16", backward=bwd)),
            )
        )
    else:
        out.append(
            ("comm fp32", make(choices, dataclasses.replace(g, forward="fp32", backward="fp32")))
        )

    def load(name: str) -> float:  # the table's own phase seconds on the rank holding it
        return sum(model.terms(by[name], choices[name].cls, g).own[: len(PHASES)])

    for st in sorted({c.cls.sharding_type for c in choices.values()}):
        name = max((n for n, c in choices.items() if c.cls.sharding_type == st), key=load)
        options = [
            ch
            for cls in enumerate_classes(by[name], topo, model.batch_size)
            if cls.sharding_type != st
            for ch in placements(cls, topo)
        ]
        if not options:
            continue
        best = min(options, key=lambda ch: model.evaluate(by, {**choices, name: ch}, g).step_time_s)
        where = f" rank {best.ranks[0]}" if len(best.ranks) == 1 else ""
        out.append((f"{name}: {st} → {best.cls.label}{where}", make({**choices, name: best}, g)))
    return out
