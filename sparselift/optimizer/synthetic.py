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
