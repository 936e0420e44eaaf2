"""The memory model against TorchRec's storage estimate: SparseLift's counts charge a shard at
least what TorchRec's EmbeddingStorageEstimator charges it, the budget is no larger than what
TorchRec's planner leaves, and what the optimizer plans fits TorchRec's storage estimate."""

from __future__ import annotations

import dataclasses
import random

import pytest

from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.feasibility import table_bytes
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.planio import to_plan
from sparselift.optimizer.problem import Problem
from sparselift.optimizer.space import TW, Choice, OptionClass, PlanWide, enumerate_classes
from sparselift.optimizer.synthetic import synthetic_stats
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset
from sparselift.optimizer.torchrec_prices import canonical_choice
from sparselift.optimizer.torchrec_referee import storage_verdicts
from sparselift.optimizer.torchrec_storage import hbm_budget, kjt_reservation, shard_storage

MB = 10**6


def _tables() -> list[TableStats]:
    stats = synthetic_stats(6, seed=11, max_rows=40_000_000)
    return [
        *stats,
        TableStats("multi", 3_000_000, 64, 0.9, feature_names=("m1", "m2", "m3")),
        TableStats("tiny", 5, 32, 0.3, feature_names=("tiny",)),
        # an EmbeddingCollection's: its output buffers hold a row per id
        TableStats("seq", 2_000_000, 64, 12.0, feature_names=("s",), sequence=True),
        # fp16 weights: TorchRec counts its tensor and its outputs at 2 bytes an element
        TableStats("fp16_t", 8_000_000, 128, 4.0, feature_names=("h",), data_type="fp16"),
    ]


@pytest.mark.parametrize("world", [8, 16])
def test_shard_storage_is_torchrecs_estimate(world):
    # every class of every table, alone in a plan: the rank with its largest shard carries what
    # TorchRec's estimator charges it (under both pipelines), to the byte
    topo, batch = preset("h100x8", world), 777
    stats = _tables()
    cases, plan_list = [], []
    for s in stats:
        for c in enumerate_classes(s, topo, batch):
            wide = PlanWide(pipeline="sparse-dist")
            plan_list.append(to_plan([s], {s.name: canonical_choice(c)}, topo, wide))
            cases.append((s, c))
    for (s, c), plan in zip(cases, plan_list, strict=True):
        (v,) = storage_verdicts([plan], [s], topo, batch)
        got = shard_storage(topo, batch, s, c)
        assert (got.hbm, got.ddr) == (max(v.hbm_per_rank), max(v.ddr_per_rank)), (s, c.label)


def test_counts_are_at_least_torchrecs_and_the_budget_its_reservation():
    topo, batch = preset("h100x8", 64), 4096
    stats = _tables()
    model = CostModel(topo, batch, coefficients(topo))
    for s in stats:
        for c in enumerate_classes(s, topo, batch):
            own, tr = model.terms(s, c).own, shard_storage(topo, batch, s, c)
            assert own.hbm_bytes >= tr.hbm and own.ddr_bytes >= tr.ddr, (s.name, c.label)
    on_rank0 = {s.name: Choice(OptionClass(TW, "fused"), (0,)) for s in stats}
    plan = to_plan(stats, on_rank0, topo, PlanWide())
    (v,) = storage_verdicts([plan], stats, topo, batch)
    assert hbm_budget(topo, batch, stats) == v.hbm_budget
    assert v.hbm_budget == int(0.85 * topo.hbm_bytes) - kjt_reservation(batch, stats)
    assert v.hbm_budget < topo.usable(topo.hbm_bytes)  # the inputs' storage is reserved too


def test_cpu_keeps_sparselifts_memory_model():
    topo = preset("cpu-gloo", 2)
    assert hbm_budget(topo, 128, _tables()) == topo.usable(topo.hbm_bytes)
    with pytest.raises(ValueError, match="CUDA"):
        shard_storage(topo, 128, _tables()[0], OptionClass(TW, "fused"))


def _io_bound_case() -> tuple[list[TableStats], object, int]:
    # 16 tables whose pooled outputs (batch × ranks × dim fp32 on the owner) weigh as much as
    # their weights: SparseLift's old model (weights + row-wise state) saw half of each shard
    topo = dataclasses.replace(preset("h100x8", 8), hbm_bytes=200 * MB)
    stats = [TableStats(f"t{i}", 65_536, 128, 1.0, feature_names=(f"f{i}",)) for i in range(16)]
    return stats, topo, 8192


def test_a_plan_the_old_model_accepted_and_torchrec_says_ooms_is_refused():
    stats, topo, batch = _io_bound_case()
    model = CostModel(topo, batch, coefficients(topo))
    by_name = {s.name: s for s in stats}
    # five tables on rank 0, the rest two per other rank
    ranks = [0] * 5 + [1 + i // 2 for i in range(11)]
    choices = {
        s.name: Choice(OptionClass(TW, "fused"), (r,)) for s, r in zip(stats, ranks, strict=True)
    }
    usable = topo.usable(topo.hbm_bytes)
    old_rank0 = sum(table_bytes(s) for s in stats[:5])
    assert old_rank0 <= usable  # the old memory model accepted it
    plan = to_plan(stats, choices, topo, PlanWide())
    (v,) = storage_verdicts([plan], stats, topo, batch)
    assert not v.fits and v.busiest_rank == 0  # TorchRec's storage estimate: rank 0 OOMs
    new = model.evaluate(by_name, choices)
    assert new.per_rank[0].hbm_bytes > hbm_budget(topo, batch, stats)  # the new model refuses it
    assert new.per_rank[0].hbm_bytes >= v.hbm_per_rank[0]

    res = optimize(Inputs(stats, topo, batch, coefficients(topo)), time_limit_s=5)
    (got,) = storage_verdicts([res.plan], stats, topo, batch)
    assert got.fits, (max(got.hbm_per_rank), got.hbm_budget)


@pytest.mark.slow
@pytest.mark.parametrize("seed,n_tables,world", [(1, 30, 8), (2, 45, 8), (3, 40, 64), (4, 60, 64)])
def test_random_workloads_fit_torchrecs_storage_estimate(seed, n_tables, world):
    topo, batch = preset("h100x8", world), 2048
    stats = synthetic_stats(n_tables, seed=seed, max_rows=40_000_000)
    res = optimize(Inputs(stats, topo, batch, coefficients(topo)), time_limit_s=3)
    (v,) = storage_verdicts([res.plan], stats, topo, batch)
    assert v.fits, (seed, max(v.hbm_per_rank), v.hbm_budget)
    for r, tr in zip(res.cost.per_rank, v.hbm_per_rank, strict=True):
        assert r.hbm_bytes >= tr  # the model's memory is the more conservative, rank by rank


def test_the_optimizer_plans_to_torchrecs_budget():
    """The budget the solver packs into is TorchRec's reservation, not the usable HBM alone."""
    topo = preset("h100x8", 8)
    stats = synthetic_stats(4, seed=0)
    model = CostModel(topo, 8192, coefficients(topo))
    cap = Problem(stats, model, PlanWide(), {s.name: [] for s in stats}).hbm_cap
    assert cap == hbm_budget(topo, 8192, stats) < topo.usable(topo.hbm_bytes)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 2])
def test_where_memory_binds_the_plan_fits_torchrecs_budget(seed):
    # weights fill 80 % of SparseLift's usable HBM and a large batch makes TorchRec reserve
    # ~10 % more for the inputs: the old model packed ranks past TorchRec's budget
    topo0, batch = preset("h100x8", 8), 8192
    stats = synthetic_stats(24, seed=seed, max_rows=10_000_000)
    hbm = int(sum(table_bytes(s) for s in stats) / (0.8 * topo0.world_size) / 0.85)
    topo = dataclasses.replace(topo0, hbm_bytes=hbm)
    res = optimize(Inputs(stats, topo, batch, coefficients(topo)), time_limit_s=5)
    (v,) = storage_verdicts([res.plan], stats, topo, batch)
    assert v.fits, (max(v.hbm_per_rank), v.hbm_budget)
    assert max(r.hbm_bytes for r in res.cost.per_rank) <= v.hbm_budget


@pytest.mark.slow
@pytest.mark.parametrize("seed", [5, 6])
def test_random_workloads_of_mixed_weight_types_fit_torchrecs_budget(seed):
    # half the tables fp16 at random, weights filling 80 % of HBM as counted in their types:
    # the plan fits TorchRec's estimate (which counts each table's element size too), rank by
    # rank under SparseLift's count, and records every table's type
    topo0, batch = preset("h100x8", 8), 4096
    rng = random.Random(seed)
    stats = [
        dataclasses.replace(s, data_type=rng.choice(("fp32", "fp16")))
        for s in synthetic_stats(24, seed=seed, max_rows=10_000_000)
    ]
    hbm = int(sum(table_bytes(s) for s in stats) / (0.8 * topo0.world_size) / 0.85)
    topo = dataclasses.replace(topo0, hbm_bytes=hbm)
    res = optimize(Inputs(stats, topo, batch, coefficients(topo)), time_limit_s=5)
    (v,) = storage_verdicts([res.plan], stats, topo, batch)
    assert v.fits, (max(v.hbm_per_rank), v.hbm_budget)
    for r, tr in zip(res.cost.per_rank, v.hbm_per_rank, strict=True):
        assert r.hbm_bytes >= tr
    assert {t.name: t.data_type for t in res.plan.model} == {s.name: s.data_type for s in stats}
    assert {"fp16", "fp32"} == {s.data_type for s in stats}
