"""Synthetic batches follow the spec's pooling and skew, are seeded, and respect --max-rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparselift.workloads import load_workload
from sparselift.workloads.batches import SyntheticBatches, zipf_ranks


def _per_feature(batch):
    return batch.sparse_features.to_dict()


def test_pooling_means_follow_the_spec():
    spec = load_workload("tiny")
    it = SyntheticBatches(spec, seed=3)
    lengths = {t.name: [] for t in spec.tables}
    for _ in range(8):
        for name, jt in _per_feature(it.next_batch()).items():
            lengths[name].append(jt.lengths())
    for t in spec.tables:
        ln = torch.cat(lengths[t.name]).double()
        assert ln.min() >= 1
        if t.pooling == "fixed":
            assert torch.all(ln == t.pooling_factor)
        else:
            assert abs(ln.mean().item() - t.pooling_factor) / t.pooling_factor < 0.05, t.name


def test_batch_shapes_and_id_ranges():
    spec = load_workload("tiny")
    b = SyntheticBatches(spec, seed=0).next_batch()
    assert b.dense_features.shape == (256, 13) and b.labels.shape == (256,)
    assert set(b.labels.tolist()) <= {0.0, 1.0}
    for t in spec.tables:
        ids = b.sparse_features[t.name].values()
        assert ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < t.num_embeddings


def test_same_seed_same_stream_other_rank_other_stream():
    spec = load_workload("tiny")
    a, b = SyntheticBatches(spec, seed=1), SyntheticBatches(spec, seed=1)
    for _ in range(2):
        x, y = a.next_batch(), b.next_batch()
        assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
        assert torch.equal(x.dense_features, y.dense_features)
    # rank 1's first batch differs from rank 0's first batch with the same seed
    first0 = SyntheticBatches(spec, seed=1).next_batch()
    other = SyntheticBatches(spec, seed=1, rank=1).next_batch()
    assert not torch.equal(other.sparse_features.values(), first0.sparse_features.values())


def test_max_rows_hashes_ids_into_the_cap():
    spec = load_workload("criteo-kaggle")
    b = SyntheticBatches(spec, seed=0, max_rows=1000, batch_size=512).next_batch()
    for t in spec.tables:
        ids = b.sparse_features[t.name].values()
        assert ids.max() < min(1000, t.num_embeddings)
    # big tables really use the whole capped range, not a corner of it
    assert b.sparse_features["cat_2"].values().unique().numel() > 250


def _fitted_exponent(ranks: torch.Tensor, top: int = 200) -> float:
    counts = np.sort(np.bincount(ranks.numpy()))[::-1][:top]
    x = np.log(np.arange(1, len(counts) + 1))
    return -np.polyfit(x, np.log(counts), 1)[0]


@pytest.mark.parametrize("alpha", [0.8, 1.0, 1.2])
def test_zipf_ranks_have_the_asked_exponent(alpha):
    g = torch.Generator().manual_seed(0)
    ranks = zipf_ranks(400_000, 100_000, alpha, g)
    assert abs(_fitted_exponent(ranks) - alpha) < 0.1


def test_uniform_when_alpha_zero():
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(zipf_ranks(100_000, 100, 0.0, g), minlength=100).double()
    assert counts.std() / counts.mean() < 0.1
