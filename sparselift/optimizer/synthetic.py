"""Synthetic DLRM-like table sets for planning benchmarks and tests (no training: only statistics)."""

from __future__ import annotations

import math
import random

from sparselift.optimizer.stats import TableStats


def synthetic_stats(n_tables: int, seed: int = 0, max_rows: int = 20_000_000) -> list[TableStats]:
    """Rows log-uniform in [1e3, max_rows], dims 32–256, pooling log-uniform 1–60, Zipf 0.8–1.3."""
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
