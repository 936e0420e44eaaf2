"""What one TorchRec distribution call costs between 2 gloo ranks (the source of
`kernels.CPU_CALL_S`).

A profile sees about one size per distribution call, so it cannot tell a call's fixed cost from its
per-byte cost by itself; the calibration takes the fixed cost measured here. Times KJTAllToAll
(input_dist: splits, lengths and values all-to-alls) and PooledEmbeddingsAllToAll (output_dist,
forward and forward+backward) and PooledEmbeddingsReduceScatter (the row-wise output_dist: on
gloo a ring all-reduce forward, an all-gather backward) over sizes from kilobytes to megabytes,
one thread per rank as the launcher sets, and prints median times and the line a + b·bytes
through them; then the same bytes moved balanced or nearly all one way (on gloo alike: each
rank's CPU copies both ends, `kernels.both_ends`), and what fp16 qcomm does to the output
distribution (on gloo over shared memory: nothing that pays).

    .venv/bin/python benchmarks/bench_dist_calls.py [--reps 25] [--quick]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

BATCH = 256


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps + 5):
        dist.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times[5:])


def _rank(rank: int, world: int, port: int, reps: int) -> None:
    from torchrec.distributed.dist_data import (
        KJTAllToAll,
        PooledEmbeddingsAllToAll,
        PooledEmbeddingsReduceScatter,
    )
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    pg = dist.group.WORLD
    rows: dict[str, list[tuple[float, float]]] = {
        "input_dist": [],
        "output_dist_fwd": [],
        "output_dist_bwd": [],
    }
    fp16_ratio: list[tuple[float, float]] = []
    for features, pooling in ((2, 1), (8, 1), (8, 10), (8, 40), (26, 20), (26, 60)):
        lengths = torch.full((features * BATCH,), pooling, dtype=torch.int32)
        kjt = KeyedJaggedTensor(
            keys=[f"f{i}" for i in range(features)],
            lengths=lengths,
            values=torch.randint(0, 1000, (int(lengths.sum()),)),
        )
        a2a = KJTAllToAll(pg, splits=[features // world] * world)

        def input_dist(a2a: Any = a2a, kjt: Any = kjt) -> None:
            out = a2a(kjt)
            while hasattr(out, "wait"):
                out = out.wait()

        sent = (kjt.values().numel() * 8 + lengths.numel() * 4) * (world - 1) / world
        rows["input_dist"].append((sent, _median_s(input_dist, reps)))
    fp16 = get_qcomm_codecs(
        QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.FP16)
    )
    for dim in (16, 64, 256, 1024, 4096):
        pooled = PooledEmbeddingsAllToAll(pg, dim_sum_per_rank=[dim // world] * world)
        pooled16 = PooledEmbeddingsAllToAll(
            pg, dim_sum_per_rank=[dim // world] * world, codecs=fp16
        )
        emb = torch.randn(BATCH * world, dim // world, requires_grad=True)
        fwd = _median_s(lambda pooled=pooled, emb=emb: pooled(emb).wait(), reps)
        both = _median_s(lambda pooled=pooled, emb=emb: pooled(emb).wait().sum().backward(), reps)
        both16 = _median_s(
            lambda pooled16=pooled16, emb=emb: pooled16(emb).wait().sum().backward(), reps
        )
        sent = BATCH * dim // world * 4 * (world - 1)
        rows["output_dist_fwd"].append((sent, fwd))
        rows["output_dist_bwd"].append((sent, max(both - fwd, 0.0)))
        fp16_ratio.append((sent, both16 / both))
    # the same bytes, balanced or nearly all one way: on gloo a rank's CPU copies both what it
    # sends and what it receives, so both take alike (`kernels.both_ends`)
    one_way: list[tuple[float, float, float]] = []
    for dim in (256, 1024, 4096):
        calls = []
        for dims in ([dim // 2, dim // 2], [dim - dim // 16, dim // 16]):
            pooled = PooledEmbeddingsAllToAll(pg, dim_sum_per_rank=dims)
            emb = torch.randn(BATCH * world, dims[rank], requires_grad=True)
            calls.append(_median_s(lambda pooled=pooled, emb=emb: pooled(emb).wait(), reps))
        one_way.append((BATCH * dim * 4 * (world - 1), *calls))  # bytes both ways together
    rows["output_dist_rs_fwd"], rows["output_dist_rs_bwd"] = [], []
    for dim in (16, 64, 256, 1024, 4096):  # row-wise output: [W·B, D] reduced to [B, D]
        rs = PooledEmbeddingsReduceScatter(pg)
        emb = torch.randn(BATCH * world, dim, requires_grad=True)
        fwd = _median_s(lambda rs=rs, emb=emb: rs(emb).wait(), reps)
        both = _median_s(lambda rs=rs, emb=emb: rs(emb).wait().sum().backward(), reps)
        out = BATCH * dim * 4  # bytes as `analysis.volumes` counts them (gloo: a ring all-reduce)
        rows["output_dist_rs_fwd"].append((2 * (world - 1) * out, fwd))
        rows["output_dist_rs_bwd"].append(((world - 1) * out, max(both - fwd, 0.0)))
    if rank == 0:
        for kind, pts in rows.items():
            x, y = np.array(pts).T
            b, a = np.polyfit(x, y, 1)
            print(
                f"{kind:<16} " + "  ".join(f"{xi / 1e3:.0f} KB {yi * 1e3:.3f} ms" for xi, yi in pts)
            )
            print(f"{'':<16} fit: {a * 1e3:.3f} ms + {b * 1e9:.2f} ns/B")
        print(
            "output_dist forward, the same bytes balanced vs 15/16 one way (rank 0): "
            + "  ".join(
                f"{x / 1e3:.0f} KB {a * 1e3:.3f} vs {b * 1e3:.3f} ms" for x, a, b in one_way
            )
        )
        print(
            "fp16 qcomm ÷ fp32, output_dist forward+backward: "
            + "  ".join(f"{x / 1e3:.0f} KB {r:.2f}×" for x, r in fp16_ratio)
        )
    dist.destroy_process_group()
    os._exit(0)  # gloo's threads can abort an orderly interpreter exit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--quick", action="store_true", help="5 calls a size")
    args = ap.parse_args()
    if args.quick:
        args.reps = 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(2, port, args.reps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
