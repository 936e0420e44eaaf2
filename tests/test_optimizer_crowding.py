"""Ranks that share cores: evening out their loads is predicted to buy nothing, less work still
pays, and nothing changes where each rank has a core of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.crowding import crowded_coefficients
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.planio import to_plan
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.space import DP, TW, Choice, OptionClass, PlanWide
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset

BATCH = 256
# two small tables (cheaper replicated than moved) and six larger ones
TABLES = [
    TableStats(f"t{i}", rows, 64, 20.0, zipf_alpha=1.0, feature_names=(f"t{i}",))
    for i, rows in enumerate([100, 200, *(2_000 * (i + 1) for i in range(6))])
]


def _manifest(d: Path, cores: int) -> Path:
    """A profile directory of 4 ranks on one host of `cores` usable cores."""
    d.mkdir()
    manifest = {
        "format": "sparselift-profile",
        "version": 1,
        "world_size": 4,
        "device": "cpu",
        "hosts": ["h0"] * 4,
        "host_cores": [cores] * 4,
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def _table_wise(ranks: list[int], topo, tables: list[TableStats] = TABLES):
    tw = OptionClass(TW, "fused")
    choices = {t.name: Choice(tw, (r,)) for t, r in zip(tables, ranks, strict=True)}
    return to_plan(tables, choices, topo, PlanWide())


def _crowded(d: Path, tables: list[TableStats] = TABLES):
    """4 ranks on 2 cores; the profiled plan puts every table on rank 0."""
    topo = preset("cpu-gloo", 4)
    base = coefficients(topo, None, dense_step_s=0.005)
    piled = _table_wise([0] * len(tables), topo, tables)
    coeffs = crowded_coefficients(base, _manifest(d, 2), piled, tables, topo, BATCH)
    return topo, base, coeffs, piled


@pytest.fixture
def crowded(tmp_path):
    return _crowded(tmp_path / "p")


def test_evening_out_shared_cores_is_predicted_no_faster(crowded):
    topo, base, coeffs, piled = crowded
    even = _table_wise([0, 1, 2, 3] * 2, topo)
    own_core = [predict_plan(p, TABLES, base, topo, BATCH).step_time_s for p in (piled, even)]
    shared = [predict_plan(p, TABLES, coeffs, topo, BATCH).step_time_s for p in (piled, even)]
    assert own_core[1] < 0.6 * own_core[0]  # a core per rank: the even plan is far faster
    assert shared[0] == pytest.approx(own_core[0])  # the profiled plan keeps its step
    assert shared[1] >= 0.97 * shared[0]  # shared cores: evening out buys (almost) nothing
    assert coeffs.crowd_factor > 1 and coeffs.measured("crowd_factor")


def test_on_shared_cores_the_solver_keeps_the_profiled_plan_where_only_balance_would_pay(
    tmp_path,
):
    large = TABLES[2:]  # none cheaper replicated: only evening out the ranks is left
    topo, _, coeffs, piled = _crowded(tmp_path / "p", large)
    result = optimize(
        Inputs(large, topo, BATCH, coeffs), time_limit_s=5, baseline=piled, min_gain=0.02
    )
    assert result.kept_baseline


def test_on_shared_cores_the_solver_still_finds_less_work(crowded):
    topo, _, coeffs, piled = crowded
    result = optimize(
        Inputs(TABLES, topo, BATCH, coeffs), time_limit_s=5, baseline=piled, min_gain=0.02
    )
    assert not result.kept_baseline
    kinds = {t.name: t.sharding_type for t in result.plan.tables}
    assert kinds["t0"] == kinds["t1"] == "data_parallel"


def test_on_shared_cores_less_work_still_pays(crowded):
    """Small tables made data-parallel drop their all-to-all work on every rank, for an
    all-reduce of a few rows: a gain the crowd bound keeps."""
    topo, _, coeffs, piled = crowded
    tw, dp = OptionClass(TW, "fused"), OptionClass(DP, "dense")
    choices = {t.name: Choice(tw, (0,)) for t in TABLES}
    lighter = dict(choices, t0=Choice(dp, ()), t1=Choice(dp, ()))
    steps = [
        predict_plan(to_plan(TABLES, c, topo, PlanWide()), TABLES, coeffs, topo, BATCH)
        for c in (choices, lighter)
    ]
    work = [sum(r.compute_s + r.comm_s for r in s.per_rank) for s in steps]
    assert work[1] < work[0]
    assert steps[1].step_time_s < steps[0].step_time_s


def test_a_core_per_rank_leaves_the_coefficients_alone(tmp_path):
    topo = preset("cpu-gloo", 4)
    base = coefficients(topo, None, dense_step_s=0.005)
    piled = _table_wise([0] * 8, topo)
    same = crowded_coefficients(base, _manifest(tmp_path / "p", 4), piled, TABLES, topo, BATCH)
    assert same == base and same.crowd_factor == 0
    assert (
        crowded_coefficients(base, _manifest(tmp_path / "q", 2), None, TABLES, topo, BATCH) == base
    )
