"""A split model's own costs timed as its steps run them: the timers the plan's transform and
recombination call, the session's records, the analysis scaling its stand-alone fits, and the
evidence the optimizer then has for them."""

from __future__ import annotations

import json

import pytest
import torch
from test_plans_virtual import ebc_of, kjt_of, random_feats, two_feature_plan

from sparselift.analysis.split_cost_fit import (
    median_step_costs,
    recombine_in_step,
    transform_in_step,
)
from sparselift.calibration import Calibration, OpFit
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import Linear, coefficients
from sparselift.optimizer.cost_model import ASSUMED_TRANSFORM_MARGIN, recombine_b_s
from sparselift.optimizer.robust import split_costs_measured
from sparselift.optimizer.topology import preset
from sparselift.profiler.split_timer import SplitCostTimer, virtual_tables


def test_a_steps_transform_and_recombination_are_timed_with_what_they_moved():
    p = two_feature_plan()
    split = p.rewrite(torch.nn.Sequential(ebc_of(p, optimizer=False)))
    feats = random_feats(torch.Generator().manual_seed(3))
    timer = SplitCostTimer(p.batch_transform(), virtual_tables(split))
    assert timer.usable and len(timer.modules) == 1

    def step() -> list[float] | None:
        timer.begin()
        out = split(p.transform_batch(kjt_of(feats)))
        out.values().sum().backward()
        return timer.end()

    assert step() is None  # no timer set: nothing timed
    timer.attach()
    record = step()
    assert record is not None
    transform_s, features, ids, recombine_s, read, written = record
    routed = ["x", "y", "b", "e"]  # "a" in 3 row ranges, "b" hot/cold, "e" in 2; "c" in columns
    assert features == len(routed) and ids == sum(len(bag) for f in routed for bag in feats[f])
    rows = len(feats["x"])
    # read: x and y 3 parts of 4 columns, b and e 2 of 4, c its 12 columns in 2 slices
    assert (read, written) == (rows * (12 + 12 + 8 + 8 + 12), rows * (4 + 4 + 4 + 12 + 4 + 4))
    assert transform_s > 0 and recombine_s > 0
    timer.detach()
    assert p.batch_transform().timer is None and step() is None


def test_the_stand_alone_fits_are_scaled_by_what_the_steps_measured():
    tx = OpFit(x="ids", a_s=1e-5, b_s=2e-9, r2=0.9, n=20)
    rc = OpFit(x="elements", a_s=0.0, b_s=1e-9, r2=0.8, n=10)
    # per step: features, ids; read, written; the steps took 3x / 2x what the fits price
    steps = [(4, 100_000, 200_000, 1_000_000), (4, 120_000, 200_000, 1_000_000)]
    records = [
        [3 * (tx.a_s * f + tx.b_s * n), f, n, 2 * rc.b_s * (r + w), r, w] for f, n, r, w in steps
    ]
    manifests = [{"split_cost_s": [records, records[:1]]}, {"split_cost_s": None}, {}]
    got_tx, got_rc = transform_in_step(tx, manifests), recombine_in_step(rc, manifests)
    assert got_tx is not None and got_rc is not None
    assert (got_tx.a_s, got_tx.b_s) == (pytest.approx(3 * tx.a_s), pytest.approx(3 * tx.b_s))
    assert got_rc.b_s == pytest.approx(2 * rc.b_s) and got_rc.a_s == 0.0
    # without step records (profiles of plans without splits, older manifests): as fitted
    assert transform_in_step(tx, [{}, {"split_cost_s": None}]) == tx
    assert recombine_in_step(None, manifests) is None


def test_a_split_profiles_costs_a_step_are_the_medians_over_every_ranks_steps():
    # what `tune` reports per iteration: rank 0 took 1, 2 and 9 ms to transform, rank 1 4 and 5
    def rec(tx_ms: float, rc_ms: float) -> list[float]:
        return [tx_ms / 1e3, 1.0, 1000.0, rc_ms / 1e3, 10.0, 20.0]

    ranks = [[rec(1, 0.5), rec(2, 0.1), rec(9, 0.2)], [rec(4, 0.3), rec(5, 0.4)]]
    tx, rc = median_step_costs({"split_cost_s": ranks}) or (0.0, 0.0)
    assert (tx, rc) == (pytest.approx(4e-3), pytest.approx(0.3e-3))
    assert median_step_costs({"split_cost_s": None}) is None and median_step_costs({}) is None


def test_split_costs_are_measured_only_where_a_split_plans_steps_timed_them():
    topo = preset("cpu-gloo", 2)
    ops = {
        "batch_transform": {"x": "ids", "a_s": 1e-5, "b_s": 2e-9, "r2": 0.9, "n": 20},
        "recombine": {"x": "elements", "a_s": 0.0, "b_s": 1e-9, "r2": 0.8, "n": 10},
    }
    doc = {"device": "cpu", "ops": ops, "provenance": {"profile": "/p/base"}}
    # fitted on the profiler's stand-alone timings only: the values, but assumed, and priced at
    # the margin (a lone call costs less than the step pays)
    alone = coefficients(topo, Calibration.from_dict(doc))
    assert alone.batch_transform == Linear(1e-5, 2e-9) and alone.recombine_b_s == 1e-9
    for name in ("batch_transform", "recombine_b_s"):
        assert alone.evidence_dict()[name]["source"] == "assumed"
    assert not split_costs_measured(alone)
    assert recombine_b_s(alone) == pytest.approx(ASSUMED_TRANSFORM_MARGIN * 1e-9)
    # a split plan's steps timed them: measured, from that profile, and priced as fitted
    stepped = Calibration.from_dict(
        json.loads(Calibration.from_dict(dict(doc, split_cost_profiles=["/p/split"])).to_bytes())
    )
    assert stepped.split_cost_profiles == ["/p/split"]
    k = coefficients(topo, stepped)
    for name in ("batch_transform", "recombine_b_s"):
        assert k.evidence_dict()[name] == {"source": "measured", "from": "/p/split"}
    assert split_costs_measured(k) and recombine_b_s(k) == 1e-9
    with pytest.raises(UserError, match="split_cost_profiles must be a list of strings"):
        Calibration.from_dict(dict(doc, split_cost_profiles="/p/split"))
