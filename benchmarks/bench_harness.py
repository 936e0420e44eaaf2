"""Harness throughput and the share of a step spent generating batches (issue 2).

Prints steps/s for `tiny` and `criteo-kaggle --max-rows 1000000` at 2 ranks with both train
pipelines, then the batch-generation time per rank-batch next to the measured step time on
criteo-kaggle (capped at 1 M rows, batch 2048): the share must stay at most 10 %. The harness makes
a run's batches before its first step (`rank.made_ahead`), so the share is what a data loader
beside training would have to keep up with, not part of the step. For reference it also times
TorchRec's own skewed-input generator (`ModelInput.generate(power_law_alpha=…)`).

    .venv/bin/python benchmarks/bench_harness.py [--steps 30] [--quick]
"""

from __future__ import annotations

import argparse
import time

import torch

from sparselift.workloads import load_workload
from sparselift.workloads.batches import SyntheticBatches
from sparselift.workloads.harness import TrainConfig, run_training


def time_generation(
    workload: str, max_rows: int | None, batch_size: int | None, n: int = 20
) -> float:
    """Seconds per batch of the SparseLift generator, on one thread as in a launched rank."""
    torch.set_num_threads(1)  # as inside a rank launched on this host
    gen = SyntheticBatches(
        load_workload(workload), seed=0, max_rows=max_rows, batch_size=batch_size
    )
    gen.next_batch()
    t0 = time.perf_counter()
    for _ in range(n):
        gen.next_batch()
    return (time.perf_counter() - t0) / n


def time_torchrec_generator(workload: str, max_rows: int | None, n: int = 5) -> float:
    """Seconds per batch of TorchRec's own skewed-input generator, for comparison."""
    from torchrec.distributed.test_utils.model_input import ModelInput

    from sparselift.workloads.models import table_configs

    spec = load_workload(workload).capped(max_rows)
    tables = table_configs(spec)
    t0 = time.perf_counter()
    for _ in range(n):
        ModelInput.generate(
            batch_size=spec.batch_size,
            tables=tables,
            num_float_features=spec.dense_in_features,
            pooling_avg=1,
            power_law_alpha=1.05,
        )
    return (time.perf_counter() - t0) / n


def main() -> None:
    """Run the benchmark and print the tables."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="small settings to check the script runs")
    args = ap.parse_args()
    cases = [("tiny", None), ("criteo-kaggle", 1_000_000)]
    if args.quick:
        cases = [("tiny", None), ("criteo-kaggle", 10_000)]
        args.steps, args.warmup = 3, 1
    results = {}
    print(
        f"{'workload':32s} {'pipeline':12s} {'steps/s':>8s} {'samples/s':>10s} "
        f"{'peak MiB/rank':>14s}"
    )
    for workload, max_rows in cases:
        for pipeline in ("base", "sparse-dist"):
            r = run_training(
                TrainConfig(
                    workload=workload,
                    nproc=2,
                    steps=args.steps,
                    warmup=args.warmup,
                    max_rows=max_rows,
                    pipeline=pipeline,
                )
            )
            results[workload, pipeline] = r
            label = workload + (f" --max-rows {max_rows}" if max_rows else "")
            print(
                f"{label:32s} {pipeline:12s} {r.steps_per_s:8.2f} {r.samples_per_s:10.0f} "
                f"{max(r.peak_memory_bytes) / 2**20:14.0f}",
                flush=True,
            )
    workload, max_rows = cases[1]
    gen_s = time_generation(workload, max_rows, None)
    step_s = results[workload, "base"].step_time_s_median
    tr_s = time_torchrec_generator(workload, max_rows)
    print(
        f"\nbatch generation, {workload} capped at {max_rows}, "
        f"batch {load_workload(workload).batch_size}/rank:"
    )
    print(
        f"  sparselift generator  {gen_s * 1e3:7.2f} ms per batch = "
        f"{100 * gen_s / step_s:5.1f} % of a {step_s * 1e3:.1f} ms step (target <= 10 %)"
    )
    print(
        f"  torchrec ModelInput   {tr_s * 1e3:7.2f} ms per batch "
        f"({tr_s / gen_s:.1f}x the sparselift generator)"
    )


if __name__ == "__main__":
    main()
