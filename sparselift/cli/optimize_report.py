"""What `sparselift optimize` prints once it has planned: the predicted comparison with TorchRec's
plan, the solver's record, the choices (splits, collectives) and the memory per rank."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparselift import plans
    from sparselift.optimizer.optimize import Result
    from sparselift.optimizer.topology import Topology


def report(
    args: argparse.Namespace,
    topo: Topology,
    res: Result,
    default: plans.Plan | None,
    baseline: plans.Plan | None,
) -> None:
    """The comparison, the solver's record, the choices (splits, collectives) and the memory
    per rank."""
    from sparselift.plans.render import collectives_line, split_lines

    s = res.plan.solver or {}
    ours = res.cost.step_time_s
    print(f"\n{'plan':24s} {'step (pred.)':>14s}")
    print(f"{'SparseLift':24s} {ours * 1e3:11.3f} ms")
    if res.baseline_cost is not None:
        tr = res.baseline_cost.step_time_s
        which = (
            "TorchRec (defaults)"
            if res.baseline is default
            else "TorchRec (statistics)"
            if res.baseline is baseline
            else "profiled plan"  # kept as it is: no TorchRec plan was cheaper
        )
        print(f"{which:24s} {tr * 1e3:11.3f} ms   → {tr / ours:.3f}× predicted speedup")
    lateness = {"SparseLift": res.cost.spread_s}
    if res.baseline_cost is not None:
        lateness[which] = res.baseline_cost.spread_s
    if any(lateness.values()):  # `cost_model.CostModel.spread_s`
        print(
            "of which the slowest rank's expected lateness at the measured rank spread: "
            + ", ".join(f"{name} {x * 1e3:.2f} ms" for name, x in lateness.items())
        )
    print(
        f"solver: {s['status']}, {res.solution.mode}, objective {s['objective'] * 1e3:.3f} ms, "
        f"bound {s['bound'] * 1e3:.3f} ms, gap {s['gap'] * 100:.2f}%, "
        f"{res.solution.wall_s:.1f} s wall, seed {s['seed']}"
    )
    evidence = res.plan.evidence or {}
    measured = sum(1 for e in evidence.values() if e.get("source") == "measured")
    print(
        f"evidence: {measured} of {len(evidence)} coefficients measured, the rest assumed "
        f"(`sparselift plan show {args.out}` lists them)"
    )
    for line in res.notes:  # the evidence checks that decided plan-wide options
        print(line)
    precision = res.plan.comm_precision
    print(
        f"choices: pipeline {res.plan.pipeline}, comm precision fwd {precision.forward} / bwd "
        f"{precision.backward}; " + mix(res.plan)
    )
    for line in split_lines(res.plan)[2:]:
        print("split " + line.strip())
    print(
        f"collectives: SparseLift {collectives_line(res.plan)}"
        + (f"; TorchRec {collectives_line(res.baseline)}" if res.baseline is not None else "")
    )
    mem = "HBM" if topo.device == "cuda" else "memory"
    cap = topo.usable(topo.hbm_bytes if topo.device == "cuda" else topo.ddr_bytes)
    print(
        f"{mem} per rank (usable {cap / 2**30:.1f} GiB): "
        + ", ".join(f"{r.rank}: {r.memory_bytes / 2**20:.1f} MiB" for r in res.cost.per_rank[:16])
        + (" …" if topo.world_size > 16 else "")
    )
    if res.kept_baseline:
        kept = [n for n in res.notes if n.startswith("kept the profiled plan")]
        given = "default plan" if res.baseline is default else "plan given the statistics"
        which = kept[0].split(":")[0].removeprefix("kept ") if kept else f"TorchRec's {given}"
        print(f"kept {which}: ours was not predicted at least {args.min_gain:.0%} faster")
    wrote_baseline = args.baseline_out and baseline is not None
    print(f"wrote {args.out}" + (f" and {args.baseline_out}" if wrote_baseline else ""))


def mix(plan: plans.Plan) -> str:
    """How many tables run each sharding type / kernel, e.g. "4× data_parallel/dense"."""
    c = Counter(f"{t.sharding_type}/{t.compute_kernel}" for t in plan.tables)
    return ", ".join(f"{n}× {k}" for k, n in sorted(c.items()))
