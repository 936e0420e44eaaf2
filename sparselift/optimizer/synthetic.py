"""Synthetic DLRM-like table sets for planning benchmarks and tests (statistics only, no
training), as table statistics, as a seeded what-if corpus of workloads, or as a workload spec for
`sparselift optimize --workload`."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from sparselift.optimizer.table_stats import TableStats


def synthetic_stats(n_tables: int, seed: int = 0, max_rows: int = 20_000_000) -> list[TableStats]:
    """`n_tables` tables drawn with `seed`: rows log-uniform in [1e3, max_rows], dims 32–256,
    pooling log-uniform 1–60, Zipf 0.8–1.3; one feature each."""
    rng = random.Random(seed)
    out = []
    for i in range(n_tables):
        rows = int(math.exp(rng.uniform(math.log(1e3), math.log(max_rows))))
        out.append(
            TableStats(
                name=f"t{i}",
                num_embeddings=rows,
                embedding_dim=rng.choice((32, 64, 128, 128, 256)),
                ids_per_sample=round(math.exp(rng.uniform(0, math.log(60))), 2),
                zipf_alpha=round(rng.uniform(0.8, 1.3), 3),
                feature_names=(f"f{i}",),
            )
        )
    return out


CORPUS_BATCHES = (512, 1024, 2048, 4096, 8192)  # per-rank batches the corpus draws from
CORPUS_MAX_ROWS = 40_000_000


@dataclass(frozen=True)
class Workload:
    """One corpus entry: its seed, tables and per-rank batch."""

    seed: int
    stats: list[TableStats]
    batch_size: int


def whatif_corpus(n: int, min_tables: int = 20, max_tables: int = 300) -> list[Workload]:
    """`n` seeded workloads for what-if planning benchmarks: per workload a table count
    log-uniform in [min_tables, max_tables], tables of `synthetic_stats` (rows log-uniform, a
    power law, in 10³–4·10⁷; dims 32–256; poolings 1–60) and a batch of 512–8192 per rank.
    Workload i is the same for every `n` > i."""
    out = []
    for seed in range(n):
        rng = random.Random(1000 + seed)
        k = int(round(math.exp(rng.uniform(math.log(min_tables), math.log(max_tables)))))
        stats = synthetic_stats(k, seed=seed, max_rows=CORPUS_MAX_ROWS)
        out.append(Workload(seed, stats, rng.choice(CORPUS_BATCHES)))
    return out


def synthetic_workload(
    n_tables: int, seed: int = 0, max_rows: int = 20_000_000, batch_size: int = 512
) -> dict[str, Any]:
    """A workload spec (the JSON `--workload FILE` reads) whose tables are `synthetic_stats`'s,
    with Poisson pooling, under a small concat-MLP model (the dims are mixed); for what-if
    planning, too large to train here."""
    return {
        "name": f"synthetic-{n_tables}",
        "description": f"{n_tables} synthetic tables (seed {seed}), for planning benchmarks",
        "batch_size": batch_size,
        "dense_in_features": 13,
        "model": {"arch": "concat-mlp", "dense_arch": [64], "over_arch": [64, 1]},
        "tables": [
            {
                "name": s.name,
                "num_embeddings": s.num_embeddings,
                "embedding_dim": s.embedding_dim,
                "pooling_factor": s.ids_per_sample,
                "pooling": "poisson",
                "zipf_alpha": s.zipf_alpha,
                "feature_names": list(s.feature_names),
            }
            for s in synthetic_stats(n_tables, seed, max_rows)
        ],
    }


TRAINABLE_DIMS = (16, 32, 64, 64, 128)
TRAINABLE_POOLINGS = (1, 1, 1, 2, 4, 5, 10, 12, 25, 30)


def trainable_workload(seed: int) -> dict[str, Any]:
    """A seeded workload spec small enough to train on 2 CPU ranks, for measured held-out checks
    (`benchmarks/bench_tune_corpus.py`): 12–24 tables, rows log-uniform in 10³–2·10⁶, dims
    16–128, Poisson poolings of mean 1–30, Zipf 0.6–1.2, a concat-MLP of two random widths and a
    batch of 512 or 1024 per rank. The same seed gives the same spec."""
    rng = random.Random(5000 + seed)
    width = rng.choice((64, 128, 256))
    tables = [
        {
            "name": f"g{i}",
            "num_embeddings": int(math.exp(rng.uniform(math.log(1e3), math.log(2e6)))),
            "embedding_dim": rng.choice(TRAINABLE_DIMS),
            "pooling_factor": rng.choice(TRAINABLE_POOLINGS),
            "pooling": "poisson",
            "zipf_alpha": round(rng.uniform(0.6, 1.2), 2),
        }
        for i in range(rng.randint(12, 24))
    ]
    return {
        "name": f"held-out-{seed}",
        "description": f"seeded random held-out spec (seed {seed})",
        "batch_size": rng.choice((512, 1024)),
        "dense_in_features": 13,
        "model": {"arch": "concat-mlp", "dense_arch": [width, 64], "over_arch": [width, 1]},
        "tables": tables,
    }
