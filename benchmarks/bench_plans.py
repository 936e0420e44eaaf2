"""TorchRec's plan vs the DLRM reference round-robin table-wise plan, and what loading a plan costs.

For `tiny` and `criteo-kaggle --max-rows 100000` at N ranks: writes both plans (TorchRec's planner
for the real topology, exported with `from_torchrec`; every table whole on rank i mod N), then
measures them side by side with `sparselift bench` and prints steps/s and the ratio to
TorchRec's plan side by side (issue 5). Last, the time to load (read + schema + consistency
checks) and convert a 1,000-table plan to a TorchRec ShardingPlan.

    .venv/bin/python benchmarks/bench_plans.py [--nproc 2] [--rounds 5] [--steps 30] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from sparselift import plans
from sparselift.bench import Contender, run_bench
from sparselift.workloads.harness import TrainConfig
from sparselift.workloads.models import build_model
from sparselift.workloads.spec import load_workload

WORKLOADS = (("tiny", None), ("criteo-kaggle", 100_000))


def write_plans(workload: str, max_rows: int | None, nproc: int, out: Path) -> tuple[Path, Path]:
    """TorchRec's plan and the round-robin plan of the workload on `nproc` ranks, in `out`."""
    spec = load_workload(workload).capped(max_rows)
    tables = spec.fingerprints()
    topo = plans.PlanTopology(nproc, nproc, "cpu" if not torch.cuda.is_available() else "cuda")
    model = build_model(spec, dense_device=torch.device("cpu"))
    tr = plans.from_torchrec(plans.torchrec_plan(model, topo, spec.batch_size), tables, topo)
    rr = plans.round_robin_table_wise(tables, topo, module=tr.module)
    paths = out / f"{workload}.torchrec.json", out / f"{workload}.round-robin.json"
    plans.save(tr, paths[0])
    plans.save(rr, paths[1])
    return paths


def time_big_plan(
    out: Path, n_tables: int = 1000, world: int = 8, repeats: int = 5
) -> dict[str, float]:
    """Seconds to load (first and median) and convert a plan of `n_tables` tables; its bytes."""
    tables = [
        dict(
            name=f"table_{i:04d}",
            num_embeddings=10_000 + i,
            embedding_dim=64,
            feature_names=[f"f_{i}"],
        )
        for i in range(n_tables)
    ]
    path = out / "big.json"
    plans.save(
        plans.round_robin_table_wise(
            tables,
            plans.PlanTopology(world, world, "cpu"),
            module="model.sparse_arch.embedding_bag_collection",
        ),
        path,
    )
    t0 = time.perf_counter()
    plans.load(path)
    first = time.perf_counter() - t0
    loads, converts = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = plans.load(path)
        loads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        p.sharding_plan()
        converts.append(time.perf_counter() - t0)
    return {
        "bytes": path.stat().st_size,
        "first_load_s": first,
        "load_s": statistics.median(loads),
        "sharding_plan_s": statistics.median(converts),
    }


def main() -> None:
    """Run the benchmark and print the tables."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 round of 3 steps: checks the script, measures nothing",
    )
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup = 1, 3, 1

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-plans-") as tmp:
        for workload, max_rows in WORKLOADS:
            tr, rr = write_plans(workload, max_rows, args.nproc, Path(tmp))
            contenders = [Contender("torchrec", str(tr)), Contender("round-robin", str(rr))]
            cfg = TrainConfig(
                workload=workload,
                nproc=args.nproc,
                steps=args.steps,
                warmup=args.warmup,
                max_rows=max_rows,
            )
            result = run_bench(
                cfg, contenders, args.rounds, echo=lambda s: print(s, file=sys.stderr, flush=True)
            )
            print(result.table(), flush=True)
            rows.append((workload + (f" (max rows {max_rows:,})" if max_rows else ""), result))
        big = time_big_plan(Path(tmp))

    print(
        f"\nsteps/s, median of {args.rounds} rounds × {args.steps} steps side by side, "
        f"{args.nproc} ranks"
    )
    print(f"  {'workload':32s} {'torchrec':>9s} {'round-robin':>12s} {'rr / torchrec':>14s}")
    for name, r in rows:
        torchrec, round_robin = r.contenders
        print(
            f"  {name:32s} {torchrec.median:9.2f} {round_robin.median:12.2f} "
            f"{r.ratio(round_robin):14.3f}"
        )
    print(
        f"\n1000-table plan ({big['bytes'] / 1024:.0f} KiB): load {big['load_s'] * 1e3:.1f} ms "
        f"(first in process {big['first_load_s'] * 1e3:.1f} ms, schema compile included), "
        f"sharding_plan() {big['sharding_plan_s'] * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
