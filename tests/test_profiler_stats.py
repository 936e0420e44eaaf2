"""Access statistics and the Zipf fit against ground truth, on KJTs from SyntheticBatches."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from sparselift.profiler.access import TableMeta
from sparselift.profiler.access_stats import access_rows, merge_histograms, table_step
from sparselift.profiler.zipf import fit_zipf_alpha
from sparselift.workloads.batches import SyntheticBatches, scatter_ids, zipf_ranks
from sparselift.workloads.spec import TableSpec, load_workload

BATCHES = 3


@pytest.fixture(scope="module")
def workload():
    """tiny plus a two-feature table, with a batch large enough for ≥ 10 k lookups per table."""
    spec = load_workload("tiny")
    extra = TableSpec(
        name="shared",
        num_embeddings=30000,
        embedding_dim=32,
        pooling_factor=3,
        pooling="poisson",
        zipf_alpha=0.8,
        feature_names=("f_a", "f_b"),
    )
    spec = dataclasses.replace(spec, tables=spec.tables + (extra,), batch_size=4096)
    gen = SyntheticBatches(spec, rank=0, seed=1)
    kjts = [gen.next_batch().sparse_features for _ in range(BATCHES)]
    metas = [
        TableMeta(t.name, t.num_embeddings, t.embedding_dim, t.features, "SUM", "ebc")
        for t in spec.tables
    ]
    steps = [table_step(m, 0, i, kjt) for i, kjt in enumerate(kjts) for m in metas]
    return spec, metas, kjts, steps


def _truth(kjt, features):
    d = kjt.to_dict()
    return (
        torch.cat([d[f].values() for f in features]),
        torch.cat([d[f].lengths() for f in features]),
    )


def test_pooling_means_within_5pct_of_spec(workload):
    spec, _, _, steps = workload
    for t in spec.tables:
        got = [s.pooling_mean for s in steps if s.table == t.name]
        assert abs(sum(got) / len(got) - t.pooling_factor) <= 0.05 * t.pooling_factor, t.name


def test_counts_match_an_exact_recount(workload):
    spec, _, kjts, steps = workload
    for s in steps:
        t = next(t for t in spec.tables if t.name == s.table)
        ids, lengths = _truth(kjts[s.step], t.features)
        assert s.ids == ids.numel() and s.id_bytes == 8 * ids.numel()
        assert s.unique_ids == len(set(ids.tolist()))
        assert s.batch_size == spec.batch_size
        assert s.pooling_max == int(lengths.max())
        assert s.pooling_p50 == pytest.approx(float(torch.quantile(lengths.double(), 0.5)))
        assert s.pooling_p99 == pytest.approx(float(torch.quantile(lengths.double(), 0.99)))
        assert s.pooling_mean == pytest.approx(ids.numel() / lengths.numel())


def test_zipf_fit_within_015_of_spec(workload):
    spec, metas, _, steps = workload
    _, alphas = access_rows(metas, steps)
    checked = 0
    for t in spec.tables:
        lookups = sum(s.ids for s in steps if s.table == t.name)
        if lookups >= 10_000:
            assert abs(alphas[t.name] - t.zipf_alpha) <= 0.15, (
                t.name,
                alphas[t.name],
                t.zipf_alpha,
            )
            checked += 1
    assert checked == len(spec.tables)


@pytest.mark.parametrize(
    "rows,alpha,n",
    [
        (1000, 0.0, 10_000),
        (100_000, 0.5, 20_000),
        (2000, 0.9, 10_000),
        (50_000, 1.3, 10_000),
        (1_000_000, 0.8, 20_000),
        (1000, 2.0, 10_000),
    ],
)
def test_zipf_fit_across_skews(rows, alpha, n):
    g = torch.Generator().manual_seed(rows + int(alpha * 10))
    ids = scatter_ids(zipf_ranks(n, rows, alpha, g), rows, 7)
    _, counts = torch.unique(ids, return_counts=True)
    assert abs(fit_zipf_alpha(counts, rows) - alpha) <= 0.15


def test_zipf_fit_degenerate_inputs():
    assert math.isnan(fit_zipf_alpha(torch.tensor([], dtype=torch.int64), 100))
    assert math.isnan(fit_zipf_alpha(torch.tensor([5]), 100))


def test_top_shares_against_recount(workload):
    spec, metas, kjts, steps = workload
    rows, _ = access_rows(metas, steps)
    assert len(rows) == len(spec.tables) * BATCHES
    for t in spec.tables:
        all_ids = torch.cat([_truth(k, t.features)[0] for k in kjts])
        uniq, counts = torch.unique(all_ids, return_counts=True)
        for share, col in ((0.01, "top1pct_share"), (0.10, "top10pct_share")):
            k = math.ceil(share * t.num_embeddings)
            hot = set(uniq[torch.argsort(counts, descending=True, stable=True)[:k]].tolist())
            for r in (r for r in rows if r["table"] == t.name):
                ids = _truth(kjts[r["step"]], t.features)[0].tolist()
                assert r[col] == pytest.approx(sum(i in hot for i in ids) / len(ids)), (t.name, col)
    skewed = next(
        r for r in rows if r["table"] == "t5"
    )  # alpha 1.3: the top 1 % holds most lookups
    uniform = next(r for r in rows if r["table"] == "t0" and r["step"] == 0)  # alpha 0
    assert skewed["top1pct_share"] > 0.5 > 0.1 > uniform["top1pct_share"]


def test_merge_histograms_sums_counts():
    uniq, counts = merge_histograms(
        [(torch.tensor([1, 5]), torch.tensor([2, 1])), (torch.tensor([5, 9]), torch.tensor([3, 4]))]
    )
    assert uniq.tolist() == [1, 5, 9] and counts.tolist() == [2, 4, 4]


def test_fbgemm_estimator_is_biased_where_ours_is_not():
    """Why zipf.py exists: fbgemm's tbe_estimate_indices_distribution misses the spec by > 0.15."""
    import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm

    g = torch.Generator().manual_seed(3)
    rows, alpha = 50_000, 1.3
    ids = scatter_ids(zipf_ranks(10_000, rows, alpha, g), rows, 7)
    _, _, fbgemm_s, _, _ = torch.ops.fbgemm.tbe_estimate_indices_distribution(ids)
    _, counts = torch.unique(ids, return_counts=True)
    ours = fit_zipf_alpha(counts, rows)
    assert abs(ours - alpha) <= 0.05 < 0.15 < abs(fbgemm_s - alpha)
