"""Does the calibration predict plans it never saw? Profile ≥3 plans of one workload, calibrate on
one, predict the others' step times, print predicted vs measured and the error (target: within 10%).

    .venv/bin/python benchmarks/bench_prediction.py --workload tiny --steps 8
    .venv/bin/python benchmarks/bench_prediction.py --workload multihot-26 --max-rows 100000 \
        --steps 8

Plans (sparselift plan files): all table-wise (round robin), all row-wise, and mixed (row-wise for
the largest tables, column-wise for the next ones, table-wise for the rest). Measured step time is
the profiled one (fastest step, slowest rank's ProfilerStep: robust on a shared host), the quantity
the trace calibrates; the median is printed too. Every plan is profiled --repeats times in
interleaved passes and the pass with the fastest step counts, since a host can slow down a whole
pass. The predictor is the optimizer's own cost model
(`sparselift.optimizer.predict.predict_plan`, what the CP-SAT solver minimizes), so this
validates the model plans are chosen by.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Profiled(NamedTuple):
    """A plan and the analysis of its least disturbed profile pass."""

    plan: Any  # sparselift.plans.Plan
    analysis: Any  # sparselift.analysis.pipeline.Analysis
    path: Path  # the pass's profile directory


def make_plans(workload: str, world: int, max_rows: int | None) -> dict:
    """name → sparselift Plan: table_wise, row_wise, mixed (with column-wise)."""
    from sparselift.plans import (
        Plan,
        PlanTopology,
        Shard,
        TableFingerprint,
        TablePlan,
        round_robin_table_wise,
    )
    from sparselift.workloads.spec import load_workload

    spec = load_workload(workload).capped(max_rows)
    fps = [
        TableFingerprint(
            name=t.name,
            num_embeddings=t.num_embeddings,
            embedding_dim=t.embedding_dim,
            feature_names=tuple(t.features),
        )
        for t in spec.tables
    ]
    topo = PlanTopology(world_size=world, local_world_size=world, device="cpu")

    def rw(t):
        base, extra = divmod(t.num_embeddings, world)
        shards, off = [], 0
        for r in range(world):
            n = base + (1 if r < extra else 0)
            shards.append(Shard(rank=r, offsets=(off, 0), sizes=(n, t.embedding_dim)))
            off += n
        return TablePlan(
            name=t.name,
            sharding_type="row_wise",
            compute_kernel="fused",
            ranks=list(range(world)),
            shards=shards,
        )

    def cw(t):
        w = t.embedding_dim // world
        return TablePlan(
            name=t.name,
            sharding_type="column_wise",
            compute_kernel="fused",
            ranks=list(range(world)),
            shards=[
                Shard(rank=r, offsets=(0, r * w), sizes=(t.num_embeddings, w)) for r in range(world)
            ],
        )

    def tw(t, r):
        return TablePlan(
            name=t.name,
            sharding_type="table_wise",
            compute_kernel="fused",
            ranks=[r],
            shards=[Shard(rank=r, offsets=(0, 0), sizes=(t.num_embeddings, t.embedding_dim))],
        )

    by_size = sorted(fps, key=lambda t: -t.num_embeddings)
    big, mid = {t.name for t in by_size[:2]}, {t.name for t in by_size[2:4]}
    mixed = [
        rw(t) if t.name in big else cw(t) if t.name in mid else tw(t, i % world)
        for i, t in enumerate(fps)
    ]
    return {
        "table_wise": round_robin_table_wise(fps, topo),
        "row_wise": Plan(model=fps, topology=topo, tables=[rw(t) for t in fps]),
        "mixed": Plan(model=fps, topology=topo, tables=mixed),
    }


def profile(
    plan_path: Path,
    out: Path,
    workload: str,
    nproc: int,
    steps: int,
    warmup: int,
    max_rows: int | None,
) -> None:
    """Profile `plan_path` with `sparselift profile` into `out` (its output silenced)."""
    cmd = [
        str(ROOT / ".venv/bin/sparselift"),
        "profile",
        "--workload",
        workload,
        "--nproc",
        str(nproc),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--plan",
        str(plan_path),
        "--out",
        str(out),
        "--no-execution-trace",
        "--after",
        "0",
        "--force",
    ]
    if max_rows:
        cmd += ["--max-rows", str(max_rows)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measured_step_s(analysis: Any) -> float:
    """Fastest profiled step (slowest rank's time): the statistic the calibration closes on."""
    per_step = analysis.steps.groupby("step")["dur_s"].max()
    return float(per_step.min())


def main(argv: list[str] | None = None) -> int:
    """Profile, calibrate on one plan, predict every plan; print and save the errors."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="tiny")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-rows", type=int, default=None)
    ap.add_argument("--calibrate-on", default="table_wise")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the profiles here")
    ap.add_argument("--reuse", action="store_true", help="reuse profiles already in --keep DIR")
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="profile every plan this many times, interleaved; the least disturbed counts",
    )
    args = ap.parse_args(argv)
    if args.workload == "multihot-26" and args.max_rows is None:
        args.max_rows = 100_000

    from sparselift import plans as splans
    from sparselift.analysis.pipeline import analyze
    from sparselift.optimizer.predict import predict_plan
    from sparselift.optimizer.table_stats import stats_from_profile
    from sparselift.optimizer.topology import preset

    work = Path(args.keep or tempfile.mkdtemp(prefix="sparselift-bench-pred-"))
    work.mkdir(parents=True, exist_ok=True)
    plans_by_name = make_plans(args.workload, args.nproc, args.max_rows)
    for name, plan in plans_by_name.items():
        splans.save(plan, work / f"{name}.plan.json")
    # interleaved passes (A B C A B C): a pass slowed down as a whole by the host does not decide
    for r in range(args.repeats):
        for name in plans_by_name:
            out = work / name / f"pass{r}"
            if not (args.reuse and (out / "manifest.json").is_file()):
                profile(
                    work / f"{name}.plan.json",
                    out,
                    args.workload,
                    args.nproc,
                    args.steps,
                    args.warmup,
                    args.max_rows,
                )
    results: dict[str, Profiled] = {}
    for name, plan in plans_by_name.items():
        runs = [analyze(work / name / f"pass{r}") for r in range(args.repeats)]
        best = min(range(len(runs)), key=lambda i: measured_step_s(runs[i]))
        results[name] = Profiled(plan, runs[best], work / name / f"pass{best}")
    cal = results[args.calibrate_on].analysis.calibration.to_dict()
    topo = preset("cpu-gloo", args.nproc, args.nproc)
    print(
        f"{args.workload} (max_rows {args.max_rows}), {args.nproc} ranks, "
        f"{args.steps} profiled steps; calibrated on {args.calibrate_on}"
    )
    print(f"{'plan':<12} {'measured ms':>12} {'predicted ms':>13} {'error':>8} {'median ms':>10}")
    errors = {}
    for name, (plan, a, path) in results.items():
        stats, batch = stats_from_profile(path)
        pred = predict_plan(plan, stats, cal, topo, batch).step_time_s
        meas = measured_step_s(a)
        errors[name] = (pred - meas) / meas
        tag = " (calibration)" if name == args.calibrate_on else ""
        med = float(statistics.median(a.steps.groupby("step")["dur_s"].max()))
        print(
            f"{name:<12} {meas * 1e3:12.2f} {pred * 1e3:13.2f} {errors[name] * 100:7.1f}% "
            f"{med * 1e3:10.2f}{tag}"
        )
    held = [abs(e) for n, e in errors.items() if n != args.calibrate_on]
    print(f"held-out max |error| {max(held) * 100:.1f}% (target 10%)")
    (work / "prediction.json").write_text(
        json.dumps({"errors": errors, "workload": args.workload}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
