"""A split model's own costs timed as its steps run them: the timers the plan's transform and
recombination call, the session's records, and the analysis scaling its stand-alone fits."""

from __future__ import annotations

import pytest
import torch
from test_plans_virtual import ebc_of, kjt_of, random_feats, two_feature_plan

from sparselift.analysis.split_cost_fit import recombine_in_step, transform_in_step
from sparselift.calibration import OpFit
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
    # read: x and y 3 parts of 4 columns, b and e 2 of 4, c its 6 columns in 2 slices
    assert (read, written) == (rows * (12 + 12 + 8 + 8 + 6), rows * (4 + 4 + 4 + 6 + 4 + 4))
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
