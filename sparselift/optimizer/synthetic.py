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


VARIED_WEIGHT_BYTES = 1 << 30  # the most weights a varied spec holds (tune's A/B trains 4 models)
VARIED_IDS_PER_STEP = 400_000  # the most ids a rank's batch holds (a step of ~0.1–0.3 s on CPU)


def varied_workload(seed: int) -> dict[str, Any]:
    """A seeded workload spec of the shapes `trainable_workload` never draws, for measured
    held-out checks (`bench_tune_corpus.py --family varied`): any of the three archs (one dim
    for dlrm and dlrm-dcn, mixed dims 8–256 for concat-mlp), 4–28 tables of 10²–4·10⁶ rows,
    fixed or Poisson poolings of mean 1–100, Zipf 0.2–1.4, a batch of 256–2048 per rank, and now
    and then a table two features share, an fp16 table or (concat-mlp) a sequence table. The
    largest table's rows are halved until the weights fit VARIED_WEIGHT_BYTES, and the batch
    (down to 128) until it holds at most VARIED_IDS_PER_STEP ids. The same seed gives the same
    spec.

    Why a second family: a model that is right on one family of shapes can be wrong on another,
    and a user's model is of neither."""
    rng = random.Random(9000 + seed)
    arch = rng.choice(("dlrm", "dlrm-dcn", "concat-mlp"))
    one_dim = rng.choice((16, 32, 64, 128))
    tables: list[dict[str, Any]] = []
    for i in range(rng.randint(4, 28)):
        t: dict[str, Any] = {
            "name": f"v{i}",
            "num_embeddings": int(math.exp(rng.uniform(math.log(1e2), math.log(4e6)))),
            "embedding_dim": one_dim if arch != "concat-mlp" else rng.choice((8, 16, 32, 64, 256)),
            "pooling_factor": rng.choice((1, 1, 2, 3, 5, 8, 15, 30, 60, 100)),
            "pooling": rng.choice(("fixed", "poisson")),
            "zipf_alpha": round(rng.uniform(0.2, 1.4), 2),
        }
        if rng.random() < 0.1:
            t["feature_names"] = [f"v{i}_a", f"v{i}_b"]
        elif rng.random() < 0.1:
            t["data_type"] = "fp16"
        elif arch == "concat-mlp" and rng.random() < 0.1:
            t["sequence"] = True
        tables.append(t)

    def weight_bytes() -> int:
        return sum(
            t["num_embeddings"] * t["embedding_dim"] * (2 if t.get("data_type") == "fp16" else 4)
            for t in tables
        )

    while weight_bytes() > VARIED_WEIGHT_BYTES:
        largest = max(tables, key=lambda t: t["num_embeddings"] * t["embedding_dim"])
        largest["num_embeddings"] //= 2
    width = rng.choice((64, 128, 256))
    model: dict[str, Any] = {
        "arch": arch,
        "dense_arch": [width, one_dim] if arch != "concat-mlp" else [width, 64],
        "over_arch": [width, 1],
    }
    batch = rng.choice((256, 512, 1024, 2048))
    lookups = sum(t["pooling_factor"] * len(t.get("feature_names", [t["name"]])) for t in tables)
    while batch * lookups > VARIED_IDS_PER_STEP and batch > 128:
        batch //= 2
    return {
        "name": f"varied-{seed}",
        "description": f"seeded random held-out spec of varied shapes (seed {seed})",
        "batch_size": batch,
        "dense_in_features": rng.choice((4, 13, 32)),
        "model": model,
        "tables": tables,
    }
