"""What FBGEMM's CPU lookup costs per pooled output element (the source of
`kernels.CPU_BAG_WEIGHT`).

The same ids (32 k drawn from 100 k rows) are pooled into 256 to 16 k bags at dims 32, 64 and 128,
through one fused EXACT_ROWWISE_ADAGRAD table on one thread (as a rank runs); forward and
backward are timed apart (median of 20) and a line through bags·dim gives the cost per output
element. Row-wise sharding writes every rank's bags on every rank, so this term is what makes it
dearer per id.

    .venv/bin/python benchmarks/bench_lookup_kernel.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    EmbeddingLocation,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from sparselift.kernels import CPU_BAG_WEIGHT

IDS, ROWS = 32768, 100_000
PER_ID_S = {"lookup_fwd": 3.2e-9, "lookup_bwd": 11e-9}  # the kernels.py fits μ is relative to


def fwd_bwd_s(
    tbe: SplitTableBatchedEmbeddingBagsCodegen,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    grad: torch.Tensor,
    reps: int,
) -> tuple[float, float]:
    """Median forward and backward seconds of `reps` calls of `tbe` on (ids, offsets), the
    backward given `grad`, after 5 warm-up calls."""
    fwd, bwd = [], []
    for _ in range(reps + 5):
        t0 = time.perf_counter()
        out = tbe(ids, offsets)
        t1 = time.perf_counter()
        out.backward(grad)
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    return statistics.median(fwd[5:]), statistics.median(bwd[5:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 calls a size")
    reps = 5 if ap.parse_args().quick else 20
    torch.set_num_threads(1)
    points = []
    for dim in (32, 64, 128):
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(ROWS, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            learning_rate=0.01,
        )
        for bags in (16384, 8192, 2048, 256):
            ids = torch.randint(0, ROWS, (IDS,))
            offsets = torch.arange(0, IDS + 1, IDS // bags)
            grad = torch.ones(bags, dim)
            points.append((bags * dim, *fwd_bwd_s(tbe, ids, offsets, grad, reps)))
            print(
                f"dim {dim:>3} bags {bags:>5}: forward {points[-1][1] * 1e3:.3f} ms, "
                f"backward {points[-1][2] * 1e3:.3f} ms",
                flush=True,
            )
    x = np.array([p[0] for p in points], float)
    for col, kind in ((1, "lookup_fwd"), (2, "lookup_bwd")):
        b, a = np.polyfit(x, np.array([p[col] for p in points]), 1)
        print(
            f"{kind}: {b * 1e9:.2f} ns per output element = {b / PER_ID_S[kind]:.2f} ids "
            f"(kernels.CPU_BAG_WEIGHT {CPU_BAG_WEIGHT[kind]})"
        )


if __name__ == "__main__":
    main()
