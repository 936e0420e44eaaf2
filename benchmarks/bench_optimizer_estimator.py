"""Judged by TorchRec's own EmbeddingPerfEstimator: cost(TorchRec's plan) ÷ cost(SparseLift's plan).

Synthetic DLRM-like workloads of 100–1,000 tables on h100x8 hosts at 8, 64 and 128 ranks. Both
plans are scored by the same referee (enumerate → copy the matching ShardingOption → set the plan's
shards → EmbeddingPerfEstimator → NoopPerfModel.rate). TorchRec's planner runs under a hard timeout
(it needs minutes at 500+ tables); a timeout is reported, and SparseLift then plans without a warm start.

    .venv/bin/python benchmarks/bench_optimizer_estimator.py            # full size (the lead runs it)
    .venv/bin/python benchmarks/bench_optimizer_estimator.py --quick    # 20 tables at 8/16 ranks
"""

from __future__ import annotations

import argparse
import json
import time

from sparselift.optimizer.calibration import coefficients
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.synthetic import synthetic_stats
from sparselift.optimizer.topology import preset
from sparselift.optimizer.torchrec_baseline import torchrec_cost, torchrec_plan_timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 128])
    ap.add_argument("--device", default="h100x8")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--torchrec-timeout", type=float, default=300.0)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="verify at small size: 20 tables, 8 and 16 ranks")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.quick:
        args.tables, args.ranks, args.torchrec_timeout, args.time_limit = [20], [8, 16], 120.0, 10.0
    rows = []
    print(f"{'tables':>6s} {'ranks':>5s} {'torchrec s':>10s} {'ours s':>7s} {'TR est (TR plan)':>17s} "
          f"{'TR est (ours)':>14s} {'ratio':>7s}")
    for n in args.tables:
        stats = synthetic_stats(n, seed=n)
        for w in args.ranks:
            topo = preset(args.device, w)
            base, tr_s, status = torchrec_plan_timed(stats, topo, args.batch_size, args.torchrec_timeout)
            t0 = time.perf_counter()
            res = optimize(Inputs(stats, topo, args.batch_size, coefficients(topo)), time_limit_s=args.time_limit,
                           baseline=base)
            ours_s = time.perf_counter() - t0
            plans_ = [base, res.plan] if base is not None else [res.plan]
            costs = torchrec_cost(plans_, stats, topo, args.batch_size)
            tr_cost = costs[0] if base is not None else None
            ours_cost = costs[-1]
            ratio = tr_cost / ours_cost if tr_cost else None
            rows.append(dict(tables=n, ranks=w, torchrec_status=status, torchrec_s=tr_s, ours_s=ours_s,
                             torchrec_est_ms=tr_cost, ours_est_ms=ours_cost, ratio=ratio,
                             ours_pred_s=res.cost.step_time_s,
                             torchrec_pred_s=res.baseline_cost.step_time_s if res.baseline_cost else None))
            fmt = lambda x, f: format(x, f) if x is not None else status  # noqa: E731
            print(f"{n:6d} {w:5d} {tr_s:10.1f} {ours_s:7.1f} {fmt(tr_cost, '17.3f')} {ours_cost:14.3f} "
                  f"{fmt(ratio, '7.3f')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
