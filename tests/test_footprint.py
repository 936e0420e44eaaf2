"""The lookup unit's footprint term: a distinct row of a large shard costs more, φ ids per
doubling past the floor, counted alike by the analysis, the unit refit and the optimizer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from sparselift.analysis.samples import lookup_context, lookup_parts
from sparselift.analysis.unit_fit import refit_unit
from sparselift.calibration import Calibration, lookup_unit
from sparselift.calibration_parts import OpFit
from sparselift.kernels import (
    FLOAT_BYTES,
    FOOTPRINT_FLOOR_BYTES,
    LookupUnit,
    expected_unique,
    footprint_doublings,
    lookup_work,
)
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.space import DP, RW, TW, OptionClass
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset

FLOOR_ROWS_AT_16 = FOOTPRINT_FLOOR_BYTES // (16 * FLOAT_BYTES)  # rows of 16 floats at the floor


def test_a_shard_pays_per_doubling_past_the_floor_and_nothing_below_it():
    assert footprint_doublings(FOOTPRINT_FLOOR_BYTES / 2) == 0.0
    assert footprint_doublings(FOOTPRINT_FLOOR_BYTES) == 0.0
    assert footprint_doublings(8 * FOOTPRINT_FLOOR_BYTES) == pytest.approx(3.0)
    unit = LookupUnit(footprint_fwd=2.0, footprint_bwd=5.0)
    base = lookup_work("lookup_bwd", "cpu", 100, 40, 16, 0.0, unit)
    assert lookup_work("lookup_bwd", "cpu", 100, 40, 16, 0.0, unit, far=30) == base + 150
    assert lookup_work("lookup_fwd", "cpu", 100, 40, 16, 0.0, unit, far=30) == pytest.approx(
        lookup_work("lookup_fwd", "cpu", 100, 40, 16, 0.0, unit) + 60
    )
    gpu = lookup_work("lookup_fwd", "cuda", 100, 40, 16, 0.0, unit)
    assert lookup_work("lookup_fwd", "cuda", 100, 40, 16, 0.0, unit, far=30) == gpu


def test_a_profiles_lookup_parts_count_each_shards_distinct_rows_times_its_doublings():
    rows = 4 * FLOOR_ROWS_AT_16  # 64 MiB whole: 2 doublings; a row-wise half: 1
    access = pd.DataFrame(
        {
            "table": ["big", "big", "small", "small"],
            "rank": [0, 1, 0, 1],
            "step": [3] * 4,
            "ids": [5000, 3000, 5000, 3000],
            "num_embeddings": [rows, rows, 1000, 1000],
            "embedding_dim": [16] * 4,
            "zipf_alpha": [0.0] * 4,
            "batch_size": [64] * 4,
        }
    )

    def parts(sharding: str, shard_rows: int) -> pd.DataFrame:
        plan = pd.DataFrame(
            [
                {
                    "table": "big",
                    "sharding_type": sharding,
                    "rank": 0,
                    "rows": shard_rows,
                    "cols": 16,
                },
                {
                    "table": "small",
                    "sharding_type": "table_wise",
                    "rank": 0,
                    "rows": 1000,
                    "cols": 16,
                },
            ]
        )
        node = pd.DataFrame(
            [{"kind": "lookup_fwd", "rank": 0, "ids": 9000, "x": 0, "tables": "big,small"}]
        )
        return lookup_parts(node, lookup_context(access, plan), world_size=2)

    whole = expected_unique(rows, 0.0, 8000)
    assert parts("table_wise", rows)["far"].iloc[0] == pytest.approx(2 * whole)
    assert parts("row_wise", rows // 2)["far"].iloc[0] == pytest.approx(whole / 2)


def _calls(rng: np.random.Generator, phi: float | None, n: int = 40) -> pd.DataFrame:
    ids = rng.uniform(2e4, 2e5, n)
    unique = ids * rng.uniform(0.2, 0.6, n)
    bags = rng.uniform(1e4, 1e5, n)
    far = unique * rng.uniform(0.0, 4.0, n)  # plans that put large tables on a rank or not
    x = ids + 5.0 * unique + 0.22 * bags + (phi or 0.0) * far
    y = 2e-4 + 3e-9 * x * rng.normal(1.0, 0.01, n)
    return pd.DataFrame({"y": y, "ids": ids, "unique": unique, "bag_elems": bags, "far": far})


def test_the_unit_refit_measures_phi_where_shard_sizes_vary_and_leaves_it_out_where_not():
    rng = np.random.default_rng(7)
    fit = refit_unit(_calls(rng, 3.0), 5.0, 0.22)
    assert fit is not None and fit.phi == pytest.approx(3.0, rel=0.1)
    assert fit.kappa == pytest.approx(5.0, rel=0.1)
    none = refit_unit(_calls(rng, None).assign(far=0.0), 5.0, 0.22)
    assert none is not None and none.phi is None and none.kappa == pytest.approx(5.0, rel=0.1)
    # shard sizes that vary but explain nothing: φ is not taken, κ and μ still are
    flat = refit_unit(_calls(rng, None), 5.0, 0.22)
    assert flat is not None and flat.phi is None and flat.mu == pytest.approx(0.22, rel=0.2)


def test_a_measured_phi_reaches_the_optimizers_counts_of_large_shards_only():
    ops = {"lookup_bwd": OpFit("work", 1e-4, 3e-9, 0.9, 40, footprint_weight=4.0)}
    unit = lookup_unit(ops)
    assert unit.footprint("lookup_bwd") == 4.0 and unit.footprint("lookup_fwd") == 0.0
    topo = preset("cpu-gloo", 2)
    measured = coefficients(topo, Calibration("cpu", "gloo", 2, 64, ops, None))
    assert measured.lookup_unit == unit
    evidence = measured.evidence_dict()["lookup_unit"]
    assert evidence["source"] == "measured" and "floor (16 MiB) assumed" in evidence["from"]
    plain = coefficients(topo)
    with_phi = dataclasses.replace(plain, lookup_unit=unit)
    # 256 MiB: 4 doublings whole, 3 for a row-wise half; the floor's own size: none
    big = TableStats("big", 16 * FLOOR_ROWS_AT_16, 16, 4.0, feature_names=("big",))
    small = TableStats("small", FLOOR_ROWS_AT_16, 16, 4.0, feature_names=("small",))
    cases = ((big, TW, 4.0, 2, 1.0), (big, RW, 3.0, 2, 0.5), (big, DP, 4.0, 1, 1.0))
    for t, sharding, doublings, batches, share in (*cases, (small, TW, 0.0, 2, 1.0)):
        c = OptionClass(sharding, "fused")
        own = [CostModel(topo, 64, k).counts(t, c).own for k in (plain, with_phi)]
        assert own[1].fwd_work == own[0].fwd_work
        uniq = t.unique(batches * 64 * 4.0) * share
        assert own[1].bwd_work - own[0].bwd_work == pytest.approx(4.0 * uniq * doublings)


def test_analyze_says_which_weights_its_profiles_measured():
    from sparselift.analysis.joint import check_lines

    fit = OpFit("work", 1e-4, 3e-9, 0.9, 40, footprint_weight=4.61)
    lines = check_lines(Calibration("cpu", "gloo", 2, 64, {"lookup_bwd": fit}, None))
    assert "  lookup_bwd unit refitted: κ kernel's, μ kernel's, φ 4.61" in lines
    plain = OpFit("work", 1e-4, 3e-9, 0.9, 40)
    lines = check_lines(Calibration("cpu", "gloo", 2, 64, {"lookup_bwd": plain}, None))
    assert not any("unit refitted" in line for line in lines)
