"""`sparselift optimize`: plan the sparse path for a profile or a workload on a target topology."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sparselift.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("optimize", help="choose a sharding/kernel/qcomm/pipeline plan with CP-SAT")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--profile", metavar="DIR", help="a profile directory analyzed by `sparselift analyze`"
    )
    src.add_argument("--workload", help="built-in workload name or spec path (what-if planning)")
    p.add_argument(
        "--calibration", metavar="FILE", help="with --workload: a calibration.json to price with"
    )
    p.add_argument(
        "--topology", metavar="FILE", help="a topology file (format sparselift-topology)"
    )
    p.add_argument(
        "--world-size", type=int, default=None, help="ranks (default: the profile's, else 2)"
    )
    p.add_argument(
        "--local-world-size", type=int, default=None, help="ranks per host (default: the profile's)"
    )
    p.add_argument(
        "--device",
        default=None,
        help="preset: cpu-gloo, h100x8, h200x8 (default: the hardware "
        "the profile or calibration ran on, else cpu-gloo)",
    )
    p.add_argument(
        "--max-rows", type=int, default=None, help="with --workload: cap every table's rows"
    )
    p.add_argument(
        "--batch-size", type=int, default=None, help="samples per rank (default: workload/profile)"
    )
    p.add_argument("--time-limit", type=float, default=30.0, help="solver seconds (default 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workers", type=int, default=1, help="CP-SAT workers (1: deterministic, default)"
    )
    p.add_argument("--mode", choices=("auto", "exact", "decomposed"), default="auto")
    p.add_argument(
        "--baseline-timeout", type=float, default=120.0, help="seconds TorchRec's planner may take"
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip TorchRec's planner (no warm start)"
    )
    p.add_argument(
        "--min-gain",
        type=float,
        default=0.10,
        help="keep TorchRec's plan unless ours is predicted this much faster (default 0.10: "
        "held-out predictions measured within about 10-15%%)",
    )
    p.add_argument(
        "--baseline-out",
        default=None,
        metavar="FILE",
        help="also write TorchRec's plan for the same inputs (pooling factors, topology)",
    )
    p.add_argument("--out", required=True, help="plan file to write")
    p.set_defaults(run=run_optimize)


def _inputs(args: argparse.Namespace):
    from sparselift.optimizer.calibration import coefficients, dense_step_estimate, load_calibration
    from sparselift.optimizer.optimize import Inputs
    from sparselift.optimizer.stats import stats_from_profile, stats_from_spec
    from sparselift.optimizer.topology import load_topology, profiled_topology

    calibration, spec = None, None
    if args.profile:
        cal = Path(args.profile, "calibration.json")
        if not Path(args.profile).is_dir():
            raise UserError(f"{args.profile}: not a profile directory")
        if not cal.is_file():
            raise UserError(
                f"{args.profile} has no calibration.json: run `sparselift analyze {args.profile}` first"
            )
        calibration = load_calibration(cal)
        stats, batch = stats_from_profile(args.profile)
        provenance = {"profile": str(args.profile)}
    else:
        from sparselift.workloads.spec import load_workload

        spec = load_workload(args.workload).capped(args.max_rows)
        stats, batch = stats_from_spec(spec), spec.batch_size
        if args.calibration:
            calibration = load_calibration(args.calibration)
        provenance = {"workload": spec.name, "max_rows": args.max_rows}
    batch = args.batch_size or batch
    if args.topology:
        if args.world_size or args.device:
            raise UserError(
                "--topology already says the world size and device; drop --world-size/--device"
            )
        topo = load_topology(args.topology)
    else:
        topo = profiled_topology(
            calibration,
            args.profile or args.calibration,
            args.world_size,
            args.local_world_size,
            args.device,
        )
    dense = dense_step_estimate(spec, topo, batch) if spec is not None else 0.0
    provenance["topology"] = topo.preset or args.topology
    return Inputs(stats, topo, batch, coefficients(topo, calibration, dense), provenance)


def run_optimize(args: argparse.Namespace) -> int:
    from sparselift import plans
    from sparselift.optimizer.optimize import optimize
    from sparselift.optimizer.torchrec_baseline import torchrec_plan_timed

    if args.min_gain < 0:  # before TorchRec's planner runs (up to minutes)
        raise UserError(f"--min-gain must be >= 0, got {args.min_gain}")
    inp = _inputs(args)
    topo = inp.topo
    print(
        f"planning {len(inp.stats)} tables for {topo.world_size} ranks ({topo.num_hosts} host(s), "
        f"{topo.preset or 'topology file'}, {topo.device}), batch {inp.batch_size}/rank, "
        f"coefficients: {inp.coeffs.source}"
    )
    baseline, default = None, None
    if not args.no_baseline:
        baseline, secs, status = torchrec_plan_timed(
            inp.stats, topo, inp.batch_size, args.baseline_timeout
        )
        print(f"TorchRec's planner, given the statistics: {status} in {secs:.1f} s")
        default, secs, status = torchrec_plan_timed(
            inp.stats, topo, inp.batch_size, args.baseline_timeout, informed=False
        )
        print(f"TorchRec's planner, as a trainer calls it by default: {status} in {secs:.1f} s")
    print("solving (CP-SAT):")
    res = optimize(
        inp,
        time_limit_s=args.time_limit,
        seed=args.seed,
        workers=args.workers,
        mode=args.mode,
        baseline=baseline,
        progress=lambda line: print(line, flush=True),
        min_gain=args.min_gain,
        other_baselines=(default,) if default is not None else (),
    )
    plans.save(res.plan, args.out)
    if args.baseline_out and baseline is not None:
        plans.save(baseline, args.baseline_out)
    s = res.plan.solver
    ours = res.cost.step_time_s
    print(f"\n{'plan':24s} {'step (pred.)':>14s}")
    print(f"{'SparseLift':24s} {ours * 1e3:11.3f} ms")
    if res.baseline_cost is not None:
        tr = res.baseline_cost.step_time_s
        which = "defaults" if res.baseline is default else "statistics"
        print(
            f"{'TorchRec (' + which + ')':24s} {tr * 1e3:11.3f} ms   → {tr / ours:.3f}× predicted speedup"
        )
    print(
        f"solver: {s['status']}, {res.solution.mode}, objective {s['objective'] * 1e3:.3f} ms, bound "
        f"{s['bound'] * 1e3:.3f} ms, gap {s['gap'] * 100:.2f}%, {res.solution.wall_s:.1f} s wall, seed {s['seed']}"
    )
    print(
        f"choices: pipeline {res.plan.pipeline}, comm precision fwd {res.plan.comm_precision.forward} / bwd "
        f"{res.plan.comm_precision.backward}; " + _mix(res.plan)
    )
    mem = "HBM" if topo.device == "cuda" else "memory"
    cap = topo.usable(topo.hbm_bytes if topo.device == "cuda" else topo.ddr_bytes)
    print(
        f"{mem} per rank (usable {cap / 2**30:.1f} GiB): "
        + ", ".join(
            f"{r['rank']}: {r['memory_bytes'] / 2**20:.1f} MiB" for r in res.cost.per_rank[:16]
        )
        + (" …" if topo.world_size > 16 else "")
    )
    if res.kept_baseline:
        print(f"kept TorchRec's plan: ours was not predicted at least {args.min_gain:.0%} faster")
    print(
        f"wrote {args.out}"
        + (f" and {args.baseline_out}" if args.baseline_out and baseline is not None else "")
    )
    sys.stdout.flush()
    return 0


def _mix(plan) -> str:
    from collections import Counter

    c = Counter(f"{t.sharding_type}/{t.compute_kernel}" for t in plan.tables)
    return ", ".join(f"{n}× {k}" for k, n in sorted(c.items()))
