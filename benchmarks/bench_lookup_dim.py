"""What FBGEMM's CPU lookup costs per id against the rows' width and weight type.

`kernels.lookup_work`'s CPU unit (ids + κ·unique + μ·bags·dim) gives an id the same cost at
every dim and weight type: `bench_lookup_kernel.py` and the kernel fits behind κ and μ measured
fp32 tables of dims 16–128 only. Here the same ids (51,200: 512 bags of 100, uniform over the
table) go through one fused EXACT_ROWWISE_ADAGRAD table on one thread (as a rank runs), at 10 k
and 187 k rows, fp32 and fp16 weights, dims 16, 64 and 256; forward and backward are timed
apart (median of 10 after 5 warm-up calls) and printed per id.

    .venv/bin/python benchmarks/bench_lookup_dim.py [--quick]
"""

from __future__ import annotations

import argparse

import torch
from bench_lookup_kernel import fwd_bwd_s
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    EmbeddingLocation,
    SplitTableBatchedEmbeddingBagsCodegen,
)

IDS, BAGS = 51_200, 512


def time_calls(rows: int, dim: int, weights: SparseType, reps: int) -> tuple[float, float]:
    """Median forward and backward seconds of one call over IDS ids in BAGS bags."""
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01,
        weights_precision=weights,
    )
    ids = torch.randint(0, rows, (IDS,), generator=torch.Generator().manual_seed(0))
    offsets = torch.arange(0, IDS + 1, IDS // BAGS)
    return fwd_bwd_s(tbe, ids, offsets, torch.ones(BAGS, dim), reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 calls a point")
    reps = 3 if ap.parse_args().quick else 10
    torch.set_num_threads(1)
    for rows in (10_000, 187_440):
        for weights in (SparseType.FP32, SparseType.FP16):
            for dim in (16, 64, 256):
                f, b = time_calls(rows, dim, weights, reps)
                print(
                    f"rows {rows:>7,} {weights.name:>4} dim {dim:>3}: forward {f * 1e3:7.3f} ms "
                    f"({f / IDS * 1e9:5.1f} ns an id), backward {b * 1e3:7.3f} ms "
                    f"({b / IDS * 1e9:5.1f} ns an id)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
