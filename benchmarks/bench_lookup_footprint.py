"""Whether FBGEMM's CPU lookup costs more per distinct row the larger the table the rows lie in.

The cost model's CPU unit (`kernels.lookup_work`) prices a distinct row at κ ids whatever the
table's size. Here the same number of ids (100 k in 2,048 bags) over the same number of distinct
rows (`--unique`, drawn afresh each call) are looked up in one fused EXACT_ROWWISE_ADAGRAD table
of growing size, at dims 16, 64 and 128, on one thread (as a rank runs); forward and backward
are timed apart (median of 8 calls after 2). Printed per size: the times and, against the
smallest table of the dim, the extra nanoseconds per distinct row and per doubling of the
table's weights past 8 MiB; then a line through the origin of those points per direction.

    .venv/bin/python benchmarks/bench_lookup_footprint.py [--unique 30000] [--quick]
"""

from __future__ import annotations

import argparse
import math
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

IDS, BAGS = 100_000, 2048
REF_BYTES = 8 * 2**20
SIZES = {  # dim: table rows
    16: (40_000, 1_000_000, 4_000_000),
    64: (40_000, 200_000, 1_000_000, 4_000_000),
    128: (40_000, 1_000_000),
}


def time_calls(
    rows: int, dim: int, unique: int, calls: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Median forward and backward seconds of `calls` lookups in a `rows` × `dim` table."""
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.01,
    )
    offsets = torch.linspace(0, IDS, BAGS + 1).long()
    fwd, bwd = [], []
    for _ in range(calls + 2):
        distinct = rng.choice(rows, unique, replace=False)
        ids = torch.from_numpy(distinct[rng.integers(0, unique, IDS)]).long()
        t0 = time.perf_counter()
        out = tbe(ids, offsets)
        t1 = time.perf_counter()
        out.sum().backward()
        fwd.append(t1 - t0)
        bwd.append(time.perf_counter() - t1)
    return statistics.median(fwd[2:]), statistics.median(bwd[2:])


def doublings(nbytes: float) -> float:
    """Doublings of `nbytes` past REF_BYTES (0 below it)."""
    return max(0.0, math.log2(nbytes / REF_BYTES))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unique", type=int, default=30_000)
    ap.add_argument("--quick", action="store_true", help="3 calls a size")
    args = ap.parse_args()
    calls = 3 if args.quick else 8
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    points: dict[str, list[tuple[float, float]]] = {"forward": [], "backward": []}
    for dim, sizes in SIZES.items():
        base = None
        for rows in sizes:
            nbytes = rows * dim * 4
            f, b = time_calls(rows, dim, args.unique, calls, rng)
            line = f"dim {dim:>3} rows {rows:>9,} ({nbytes / 2**20:7.1f} MiB): "
            line += f"forward {f * 1e3:6.2f} ms, backward {b * 1e3:6.2f} ms"
            if base is None:
                base = (doublings(nbytes), f, b)
            else:
                dd = doublings(nbytes) - base[0]
                extra = [(t - t0) / args.unique * 1e9 for t, t0 in ((f, base[1]), (b, base[2]))]
                points["forward"].append((dd, extra[0]))
                points["backward"].append((dd, extra[1]))
                line += f"; +{extra[0]:.0f} / +{extra[1]:.0f} ns a distinct row over {dd:.1f}"
                line += " doublings"
            print(line, flush=True)
    for side, pts in points.items():
        x, y = np.array(pts).T
        print(f"{side}: {float(x @ y / (x @ x)):.1f} ns a distinct row per doubling past 8 MiB")


if __name__ == "__main__":
    main()
