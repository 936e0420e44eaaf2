"""Seeded synthetic batches (KJT + dense + labels) that follow a workload's pooling and skew.

Ids are drawn by inverse transform from the continuous Zipf (power-law) law over ranks
1..N — one vectorized torch expression per table, so a batch costs far less than a training step
(benchmarks/bench_harness.py measures the share) — then scattered over the table by a
multiplicative hash so that hot rows are spread over row ranges, as in real data. With `max_rows`
ids are hashed into at most that many rows, exactly like a capped production table.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparselift.workloads.spec import TableSpec, WorkloadSpec

_SCATTER = 2654435761  # prime; (rank * P + salt) mod N is a bijection on 0..N-1 when N < P


def zipf_ranks(n: int, rows: int, alpha: float, gen: torch.Generator) -> torch.Tensor:
    """`n` popularity ranks in [0, rows): P(rank k) ∝ ∫_{k+1}^{k+2} x^-alpha dx (uniform at 0)."""
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    if alpha == 0.0:
        r = u * rows
    elif abs(alpha - 1.0) < 1e-9:
        r = torch.exp(u * math.log(rows + 1.0)) - 1.0
    else:
        e = 1.0 - alpha
        r = ((math.pow(rows + 1.0, e) - 1.0) * u + 1.0).pow(1.0 / e) - 1.0
    return r.to(torch.int64).clamp_(0, rows - 1)


def scatter_ids(ranks: torch.Tensor, rows: int, salt: int) -> torch.Tensor:
    """Map popularity ranks to row ids so that hot rows are not all at the start of the table."""
    return (ranks * _SCATTER + salt % rows) % rows


def sample_lengths(table: TableSpec, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Ids per sample of one feature: exactly `pooling_factor` (fixed pooling), or
    1 + Poisson(pooling_factor - 1) (poisson pooling: mean kept, at least 1)."""
    if table.pooling == "fixed":
        return torch.full((batch,), int(table.pooling_factor), dtype=torch.int64)
    rate = torch.full((batch,), table.pooling_factor - 1.0, dtype=torch.float64)
    return torch.poisson(rate, generator=gen).to(torch.int64) + 1


@dataclass
class SyntheticBatches:
    """An endless, seeded stream of batches for one rank; the same (seed, rank), the same stream.

    Attributes:
        spec: the workload, uncapped: ids follow the real cardinalities, then are hashed into
            `max_rows`.
        rank: the rank the stream is for (each rank gets its own).
        seed: the run's seed.
        max_rows: hash ids into at most this many rows per table; None for the real sizes.
        batch_size: samples per batch; None: the workload's.
    """

    spec: WorkloadSpec
    rank: int = 0
    seed: int = 0
    max_rows: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        self._gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank)
        self._keys = [f for t in self.spec.tables for f in t.features]
        self._b = self.batch_size or self.spec.batch_size

    def __iter__(self) -> Iterator[Batch]:
        """Batches without end (`next_batch` each time)."""
        while True:
            yield self.next_batch()

    def next_batch(self) -> Batch:
        """The next batch: a KJT with every feature in table order, dense features, 0/1 labels."""
        b, g = self._b, self._gen
        values, lengths = [], []
        for ti, t in enumerate(self.spec.tables):
            for fi, _ in enumerate(t.features):
                ln = sample_lengths(t, b, g)
                n = int(ln.sum())
                ids = scatter_ids(
                    zipf_ranks(n, t.num_embeddings, t.zipf_alpha, g),
                    t.num_embeddings,
                    salt=7919 * (ti + 1) + fi,
                )
                if self.max_rows:
                    ids = ids % min(self.max_rows, t.num_embeddings)
                values.append(ids)
                lengths.append(ln)
        kjt = KeyedJaggedTensor(
            keys=self._keys, values=torch.cat(values), lengths=torch.cat(lengths)
        )
        dense = torch.rand(b, self.spec.dense_in_features, generator=g)
        labels = torch.randint(0, 2, (b,), generator=g).float()
        return Batch(dense_features=dense, sparse_features=kjt, labels=labels)
