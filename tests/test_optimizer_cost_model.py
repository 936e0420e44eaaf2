"""The cost model: incremental caches, skew pricing, predict_plan on any plan."""

from __future__ import annotations

import dataclasses

import pytest

from sparselift import plans
from sparselift.kernels import zipf_share
from sparselift.optimizer.coefficients import Linear, coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.planio import fingerprints, plan_topology
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.space import CW, RW, TW, Choice, OptionClass, enumerate_classes
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset

T = [
    TableStats(f"t{i}", 1000 * (i + 1), 32, 2.0 + i, zipf_alpha=1.1, feature_names=(f"t{i}",))
    for i in range(4)
]


def test_changed_stats_recompute_only_that_table():
    topo = preset("cpu-gloo", 2)
    m = CostModel(topo, 64, coefficients(topo))
    for t in T:
        for c in enumerate_classes(t, topo, 64):
            m.terms(t, c)
    before = m._counts.cache_info().misses
    changed = dataclasses.replace(T[1], ids_per_sample=9.0)
    n = len(enumerate_classes(changed, topo, 64))
    for t in [T[0], changed, T[2], T[3]]:
        for c in enumerate_classes(t, topo, 64):
            m.terms(t, c)
    assert m._counts.cache_info().misses - before == n
    # a changed coefficient re-multiplies cached counts: no new count computations
    m.coeffs = dataclasses.replace(m.coeffs, lookup_fwd=Linear(0.0, 1e-8))
    m.terms(T[0], OptionClass(TW, "fused"))
    assert m._counts.cache_info().misses - before == n


def test_hot_share_from_zipf_and_measured_points():
    assert zipf_share(10_000, 0.0, 0.1) == pytest.approx(0.1, rel=1e-3)
    assert zipf_share(10_000, 1.2, 0.01) > 0.5
    t = TableStats("x", 10_000, 16, 1.0, top1pct_share=0.3, top10pct_share=0.6)
    assert t.hot_share(0.01) == pytest.approx(0.3) and t.hot_share(0.1) == pytest.approx(0.6)
    assert t.hot_share(0.05) < t.hot_share(0.2) <= 1.0


def test_predict_plan_of_round_robin_and_balance():
    topo = preset("cpu-gloo", 2)
    rr = plans.round_robin_table_wise(fingerprints(T), plan_topology(topo))
    cost = predict_plan(rr, T, None, topo, batch_size=64)
    assert cost.step_time_s > 0 and len(cost.per_rank) == 2
    assert cost.per_rank[0].memory_bytes > 0
    # lookups follow the owner: t3 (largest pooling) on rank 1
    assert cost.per_rank[1].compute_s > cost.per_rank[0].compute_s


def test_column_shards_split_lookup_work_on_gpu_not_on_cpu():
    wide = TableStats("wide", 4000, 128, 3.0, zipf_alpha=1.1, feature_names=("wide",))
    for device in ("h100x8", "cpu-gloo"):
        topo = preset(device, 2 if device == "cpu-gloo" else 8)
        m = CostModel(topo, 64, coefficients(topo))
        tw, cw = m.terms(wide, OptionClass(TW, "fused")), m.terms(wide, OptionClass(CW, "fused", 2))
        fwd, bwd = cw.own[1] / tw.own[1], cw.own[4] / tw.own[4]  # lookup per shard ÷ whole table
        if device == "h100x8":  # GPU lookups move elements: half the columns, about half the work
            assert (
                0.5 * 1.15 < fwd < 0.55 * 1.15 and 0.5 * 1.15 < bwd < 0.55 * 1.15
            )  # (64-wide rows)
        else:  # FBGEMM's CPU kernels pay every id and distinct row again; only the outputs halve
            assert 0.5 < fwd < 1 and 0.9 < bwd < 1
        assert cw.own[0] == pytest.approx(tw.own[0])  # every shard receives all the ids


def test_cpu_backward_is_paid_per_distinct_row():
    from sparselift.kernels import expected_unique

    topo = preset("cpu-gloo", 2)
    m = CostModel(topo, 64, coefficients(topo))
    hot = TableStats("hot", 100_000, 32, 8.0, zipf_alpha=1.4, feature_names=("hot",))
    flat = TableStats("flat", 100_000, 32, 8.0, zipf_alpha=0.0, feature_names=("flat",))
    bwd = [m.terms(t, OptionClass(TW, "fused")).own[4] for t in (hot, flat)]
    assert bwd[1] > 2 * bwd[0]  # same ids, far more distinct rows
    ids = 2 * 64 * 8.0
    assert expected_unique(100_000, 0.0, ids) == pytest.approx(ids, rel=0.01)


def test_row_wise_output_is_an_all_reduce_on_gloo():
    t = T[2]
    gloo, gpu = preset("cpu-gloo", 4, 4), preset("h100x8", 4, 4)
    for topo, sent in (
        (gloo, 2.0 * 3 / 4 * 4),
        (gpu, 3.0),
    ):  # ring all-reduce of W·B·d vs a reduce-scatter
        m = CostModel(topo, 64, coefficients(topo))
        counts = m.counts(t, OptionClass(RW, "fused")).own
        assert counts.out_fwd_intra == pytest.approx(sent * 64 * t.embedding_dim * 4)


def test_gloo_bytes_cost_both_ends_so_two_ranks_move_the_same_wherever_tables_are():
    # every table on rank 0, or split between the ranks: on gloo each rank copies what it sends
    # and what it receives, so on 2 ranks both pay every byte either way; NCCL's owner pays
    tw = OptionClass(TW, "fused")
    by = {t.name: t for t in T}
    piled = {t.name: Choice(tw, (0,)) for t in T}
    spread = {t.name: Choice(tw, (i % 2,)) for i, t in enumerate(T)}
    phases = ("input_dist", "output_dist_fwd", "output_dist_bwd")
    gloo = CostModel(preset("cpu-gloo", 2), 64, coefficients(preset("cpu-gloo", 2)))
    for choices in (piled, spread):
        r0, r1 = gloo.rank_loads(by, choices)
        for ph in phases:
            assert getattr(r0, ph) == pytest.approx(getattr(r1, ph)) and getattr(r1, ph) > 0
    for ph in phases:  # and as much wherever the tables are
        a, b = (getattr(gloo.rank_loads(by, c)[0], ph) for c in (piled, spread))
        assert a == pytest.approx(b)
    gpu = CostModel(preset("h100x8", 2), 64, coefficients(preset("h100x8", 2)))
    r0, r1 = gpu.rank_loads(by, piled)
    assert all(getattr(r0, ph) > 0 == getattr(r1, ph) for ph in phases)


def test_a_cold_part_touches_the_tables_distinct_rows_past_its_hot_ones():
    from sparselift.kernels import expected_unique
    from sparselift.optimizer.split_options import hot_cold_from_zipf

    t = TableStats("big", 200_000, 64, 100.0, zipf_alpha=1.05, feature_names=("big",))
    draws = 2 * 1024 * t.ids_per_sample
    whole = expected_unique(t.num_embeddings, t.zipf_alpha, draws)
    for opt in hot_cold_from_zipf(t, list(range(t.num_embeddings))):
        hot, cold = opt.parts
        cold_draws = draws * cold.ids_per_sample / t.ids_per_sample
        # fewer ids, nearly every distinct row: the cold part is the law's tail, not its head
        assert whole - hot.num_embeddings <= cold.unique(cold_draws) <= whole
        assert cold.unique(cold_draws) > 1.2 * expected_unique(t.num_embeddings, 1.05, cold_draws)


def test_a_uvm_cached_table_without_a_load_factor_is_priced_at_the_size_it_runs_with():
    # TorchRec's planner leaves the load factor out of its plans; TorchRec and FBGEMM then cache 0.2
    from sparselift.optimizer.planio import choices_from_plan, to_plan
    from sparselift.optimizer.space import Choice, PlanWide

    topo = preset("h100x8", 8)
    named = to_plan(
        T,
        {
            t.name: Choice(OptionClass(TW, "fused_uvm_caching", 1, 0.2), (i,))
            for i, t in enumerate(T)
        },
        topo,
        PlanWide(),
    )
    unnamed = dataclasses.replace(
        named, tables=[dataclasses.replace(t, cache_load_factor=None) for t in named.tables]
    )
    choices, _ = choices_from_plan(unnamed, topo)
    assert {ch.cls.cache_load_factor for ch in choices.values()} == {
        plans.DEFAULT_CACHE_LOAD_FACTOR
    }
    assert (
        predict_plan(unnamed, T, None, topo).step_time_s
        == predict_plan(named, T, None, topo).step_time_s
    )
