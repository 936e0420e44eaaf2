"""Planning time for 1,000 tables × 128 ranks: SparseLift's CP-SAT planner vs TorchRec's planner.

Target: SparseLift ≤ 60 s (decomposed formulation, one deterministic worker), well under TorchRec's
EmbeddingShardingPlanner on the same input (given --torchrec-timeout, default 600 s).

    .venv/bin/python benchmarks/bench_optimizer_time.py           # full size
    .venv/bin/python benchmarks/bench_optimizer_time.py --quick   # 100 tables × 16 ranks
"""

from __future__ import annotations

import argparse
import time

from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.synthetic import synthetic_stats
from sparselift.optimizer.topology import preset
from sparselift.optimizer.torchrec_baseline import torchrec_plan_timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=128)
    ap.add_argument("--device", default="h100x8")
    ap.add_argument("--time-limit", type=float, default=50.0, help="SparseLift's solver limit")
    ap.add_argument("--torchrec-timeout", type=float, default=600.0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.tables, args.ranks, args.time_limit, args.torchrec_timeout = 100, 16, 10.0, 120.0
    stats = synthetic_stats(args.tables, seed=args.tables)
    topo = preset(args.device, args.ranks)
    t0 = time.perf_counter()
    res = optimize(
        Inputs(stats, topo, 512, coefficients(topo)),
        time_limit_s=args.time_limit,
        progress=lambda line: print(line, flush=True),
    )
    ours = time.perf_counter() - t0
    solver = res.plan.solver or {}
    print(
        f"SparseLift: {ours:.1f} s end to end ({res.solution.mode}, {solver['status']}, "
        f"gap {solver['gap'] * 100:.1f}%), predicted step {res.cost.step_time_s * 1e3:.3f} ms",
        flush=True,
    )
    _, tr, status = torchrec_plan_timed(stats, topo, 512, args.torchrec_timeout)
    print(f"TorchRec planner: {status} after {tr:.1f} s")
    print(
        f"{args.tables} tables × {args.ranks} ranks: SparseLift {ours:.1f} s vs TorchRec "
        f"{'>' if status == 'timeout' else ''}{tr:.1f} s → {tr / ours:.1f}× faster"
        f"{' (at least)' if status == 'timeout' else ''}; "
        f"target ≤ 60 s: {'met' if ours <= 60 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
