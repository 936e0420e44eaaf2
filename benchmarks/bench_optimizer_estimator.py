"""Judged by TorchRec's own EmbeddingPerfEstimator: cost(TorchRec's plan) ÷ cost(SparseLift's plan).

Synthetic DLRM-like workloads of 100–1,000 tables on h100x8 hosts at 8, 64 and 128 ranks. Both
plans are scored by the same referee (enumerate → copy the matching ShardingOption → set the plan's
shards → EmbeddingPerfEstimator → NoopPerfModel.rate). TorchRec's planner runs under a hard timeout
(it needs minutes at 500+ tables); a timeout is reported, and SparseLift then plans without a warm start.

`ratio` is the referee's verdict as TorchRec reads it (max over ranks of each rank's summed perf);
`sync ratio` reads the same per-shard estimates as a synchronous step (Σ over fwd/bwd compute and
comms of the max over ranks: every part ends in a collective all ranks wait for), the objective
SparseLift minimizes. Where they disagree, the plans differ in objective, not in cost estimates.

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
          f"{'TR est (ours)':>14s} {'ratio':>7s} {'sync ratio':>10s}")
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
            tr_cost = costs[0].rate_ms if base is not None else None
            ours_cost = costs[-1].rate_ms
            ratio = tr_cost / ours_cost if tr_cost else None
            sync = costs[0].synchronous_ms / costs[-1].synchronous_ms if base is not None else None
            rows.append(dict(tables=n, ranks=w, torchrec_status=status, torchrec_s=tr_s, ours_s=ours_s,
                             torchrec_est_ms=tr_cost, ours_est_ms=ours_cost, ratio=ratio, sync_ratio=sync,
                             ours_pred_s=res.cost.step_time_s,
                             torchrec_pred_s=res.baseline_cost.step_time_s if res.baseline_cost else None))
            fmt = lambda x, f: format(x, f) if x is not None else status  # noqa: E731
            print(f"{n:6d} {w:5d} {tr_s:10.1f} {ours_s:7.1f} {fmt(tr_cost, '17.3f')} {ours_cost:14.3f} "
                  f"{fmt(ratio, '7.3f')} {fmt(sync, '10.3f')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
