"""Judged by TorchRec's own EmbeddingPerfEstimator: cost(TorchRec's plan) ÷ cost(SparseLift's plan).

Synthetic DLRM-like workloads of 100–1,000 tables on h100x8 hosts at 8, 64 and 128 ranks. Both
plans are scored by the same referee (enumerate → copy the matching ShardingOption → set the plan's
shards → EmbeddingPerfEstimator → NoopPerfModel.rate). TorchRec's planner runs under a hard
timeout (it needs minutes at 500+ tables); a timeout is reported, and SparseLift then plans
without a warm start.

Each plan is scored as it runs, its collectives at the precision it sets (TorchRec's estimator reads
the qcomm codecs): TorchRec's planner leaves them fp32; SparseLift picks fp16 / bf16 where the bytes
saved pay for the conversion (across hosts).
- `ratio`: the referee's verdict as TorchRec reads it (max over ranks of each rank's summed perf).
- `same prec.`: that ratio with TorchRec's plan given SparseLift's precision too — what the sharding
  alone is worth. With `--replan` TorchRec's planner plans again for that precision, as for a user
  who enables qcomm (one more planner run per size).
- `sync ratio`: the per-shard estimates read as a synchronous step (Σ over fwd/bwd compute and comms
  of the max over ranks: every part ends in a collective all ranks wait for), the objective
  SparseLift minimizes. Where it and `ratio` disagree, the plans differ in objective, not in costs.

    .venv/bin/python benchmarks/bench_optimizer_estimator.py            # full size (slow)
    .venv/bin/python benchmarks/bench_optimizer_estimator.py --quick    # 20 tables at 8/16 ranks
    .venv/bin/python benchmarks/bench_optimizer_estimator.py --tables 250 --ranks 64 --explain

`--explain` first sets the two cost models side by side: for every table as one table-wise shard,
TorchRec's estimate ÷ SparseLift's term, median by embedding width. Where the ratios differ between
lookups and communication, the two models weigh a plan's parts differently, and the `ratio` above
can fall below 1.0 while the `sync ratio` does not.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import pandas as pd

from sparselift import plans
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import PHASES
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.space import TW, OptionClass
from sparselift.optimizer.synthetic import synthetic_stats
from sparselift.optimizer.topology import Topology, preset
from sparselift.optimizer.torchrec_baseline import torchrec_plan_timed
from sparselift.optimizer.torchrec_referee import table_estimates, torchrec_cost

# TorchRec's perf part ↔ SparseLift's phase, for a table-wise shard
PAIRS = {
    "lookup fwd": ("fwd_compute", "lookup_fwd"),
    "lookup bwd": ("bwd_compute", "lookup_bwd"),
    "output comms": ("fwd_comms", "output_dist_fwd"),
}


def explain(stats: list, topo: Topology, batch_size: int) -> None:
    """TorchRec's estimate ÷ SparseLift's term per table (table-wise, fused), median by width."""
    tr = table_estimates(stats, topo, batch_size)
    model = CostModel(topo, batch_size, coefficients(topo))
    rows = []
    for s in stats:
        own = dict(zip(PHASES, model.terms(s, OptionClass(TW, "fused")).own, strict=False))
        rows.append(
            {
                "width": s.embedding_dim,
                **{k: tr[s.name][a] / (own[b] * 1e3) for k, (a, b) in PAIRS.items()},
            }
        )
    table = pd.DataFrame(rows).groupby("width").median()
    print(
        f"TorchRec ÷ SparseLift per table-wise table, median by width ({len(stats)} tables, "
        f"{topo.world_size} ranks):\n{table.round(3).to_string()}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 128])
    ap.add_argument("--device", default="h100x8")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--torchrec-timeout", type=float, default=300.0)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument(
        "--quick", action="store_true", help="verify at small size: 20 tables, 8 and 16 ranks"
    )
    ap.add_argument(
        "--explain", action="store_true", help="first set the two cost models side by side"
    )
    ap.add_argument(
        "--replan",
        action="store_true",
        help="`same prec.`: TorchRec's planner plans again for SparseLift's comm precision",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.tables, args.ranks, args.torchrec_timeout, args.time_limit = [20], [8, 16], 120.0, 10.0
    rows = []
    header = (
        f"{'tables':>6s} {'ranks':>5s} {'torchrec s':>10s} {'ours s':>7s} "
        f"{'TR est (TR plan)':>17s} "
        f"{'TR est (ours)':>14s} {'ratio':>7s} {'same prec.':>10s} {'sync ratio':>10s}"
    )
    if not args.explain:
        print(header)
    for n in args.tables:
        stats = synthetic_stats(n, seed=n)
        for w in args.ranks:
            topo = preset(args.device, w)
            if args.explain:
                explain(stats, topo, args.batch_size)
                print(header)
            base, tr_s, status = torchrec_plan_timed(
                stats, topo, args.batch_size, args.torchrec_timeout
            )
            t0 = time.perf_counter()
            res = optimize(
                Inputs(stats, topo, args.batch_size, coefficients(topo)),
                time_limit_s=args.time_limit,
                baseline=base,
            )
            ours_s = time.perf_counter() - t0
            plans_ = [res.plan]
            if base is not None:  # TorchRec's plan as it runs, and at SparseLift's comm precision
                cp = res.plan.comm_precision
                same_plan: plans.Plan | None = dataclasses.replace(base, comm_precision=cp)
                if args.replan and cp != base.comm_precision:
                    same_plan, _, replan_status = torchrec_plan_timed(
                        stats, topo, args.batch_size, args.torchrec_timeout, comm_precision=cp
                    )
                    if same_plan is None:
                        print(f"TorchRec's planner at {cp.forward}/{cp.backward}: {replan_status}")
                plans_ += [base] + ([same_plan] if same_plan is not None else [])
            costs = torchrec_cost(plans_, stats, topo, args.batch_size)
            ours_cost = costs[0].rate_ms
            tr_cost = costs[1].rate_ms if base is not None else None
            ratio = tr_cost / ours_cost if tr_cost else None
            same = costs[2].rate_ms / ours_cost if len(costs) > 2 else None
            sync = costs[1].synchronous_ms / costs[0].synchronous_ms if base is not None else None
            rows.append(
                dict(
                    tables=n,
                    ranks=w,
                    torchrec_status=status,
                    torchrec_s=tr_s,
                    ours_s=ours_s,
                    torchrec_est_ms=tr_cost,
                    ours_est_ms=ours_cost,
                    ratio=ratio,
                    same_precision_ratio=same,
                    sync_ratio=sync,
                    comm_precision=dataclasses.asdict(res.plan.comm_precision),
                    ours_pred_s=res.cost.step_time_s,
                    torchrec_pred_s=res.baseline_cost.step_time_s if res.baseline_cost else None,
                )
            )

            def fmt(x: float | None, f: str, status: str = status) -> str:
                return format(x, f) if x is not None else status

            print(
                f"{n:6d} {w:5d} {tr_s:10.1f} {ours_s:7.1f} {fmt(tr_cost, '17.3f')} "
                f"{ours_cost:14.3f} "
                f"{fmt(ratio, '7.3f')} {fmt(same, '10.3f')} {fmt(sync, '10.3f')}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
