"""The slowest rank's expected lateness: Clark's expected maximum, the spread a calibration
measures from each rank's lookups, and the premium the cost model adds to a balanced plan."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparselift import plans
from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.fit import fit_evidence
from sparselift.analysis.joint import fit_jointly
from sparselift.analysis.pipeline import analyze
from sparselift.analysis.rank_spread import lookup_rank_spread, lookups_by_rank, rank_premium_s
from sparselift.analysis.samples import SAMPLE_COLUMNS
from sparselift.analysis.step_model import dense_fit
from sparselift.calibration import UNITS, Calibration, OpFit
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.planio import fingerprints, plan_topology
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.space import DP, TW, Choice, OptionClass
from sparselift.optimizer.table_stats import TableStats, stats_from_profile
from sparselift.optimizer.topology import preset
from sparselift.plans.render import show
from sparselift.spread import expected_max, premium_s


def test_two_ranks_predicted_alike_end_sigma_over_root_pi_later():
    assert expected_max([1.0, 1.0], [0.1, 0.1]) == pytest.approx(1.0 + 0.1 / math.sqrt(math.pi))
    # a rank far ahead of the other sets the step: no premium to speak of
    assert premium_s([1.0, 0.5], [0.1, 0.1]) < 1e-4
    # no spread, no premium; the premium grows with the spread
    assert premium_s([1.0, 0.9, 1.0], [0.0, 0.0, 0.0]) == 0.0
    assert 0 < premium_s([1.0, 1.0], [0.05, 0.05]) < premium_s([1.0, 1.0], [0.1, 0.1])


@pytest.mark.parametrize("seed", range(4))
def test_expected_max_matches_sampling_for_many_ranks(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 40))
    means = rng.uniform(0.8, 1.0, n)
    sigmas = rng.uniform(0.0, 0.1, n)
    sampled = (means + sigmas * rng.standard_normal((200_000, n))).max(axis=1).mean()
    assert expected_max(list(means), list(sigmas)) == pytest.approx(sampled, abs=0.1 * sigmas.max())


def test_expected_max_refuses_what_is_not_a_set_of_normals():
    with pytest.raises(ValueError):
        expected_max([], [])
    with pytest.raises(ValueError):
        expected_max([1.0, 2.0], [0.1])
    with pytest.raises(ValueError):
        expected_max([1.0], [-0.1])


def _calls(per_rank_scale: list[float], steps: int = 4, group: str = "table_wise") -> pd.DataFrame:
    """One profile's lookup calls: each rank does 1e6 units per step per kind, and takes
    `per_rank_scale[r]` × what a line of 1 ns per unit says."""
    rows = []
    for r, k in enumerate(per_rank_scale):
        for step in range(steps):
            for kind in ("lookup_fwd", "lookup_bwd"):
                x = 1e6
                rows.append(dict(rank=r, step=step, kind=kind, group=group, x=x, y=k * 1e-9 * x))
    return pd.DataFrame(rows)


def _ops(a_s: float, b_s: float) -> dict[str, OpFit]:
    return {k: OpFit(UNITS[k], a_s, b_s, r2=1.0, n=8) for k in ("lookup_fwd", "lookup_bwd")}


OPS = _ops(0.0, 1e-9)


def test_spread_is_measured_about_each_profiles_level():
    # profile A ran 20 % slow on every rank, B on time: levels are not spread
    level_only = [lookups_by_rank(_calls([1.2, 1.2]), OPS, "cpu") for _ in range(2)]
    assert lookup_rank_spread(level_only) == pytest.approx(0.0, abs=1e-12)
    # one rank 10 % over and the other 10 % under the line, in each of two profiles
    skewed = [lookups_by_rank(_calls([1.1, 0.9]), OPS, "cpu") for _ in range(2)]
    d = math.log(1.1 / 0.9) / 2
    assert lookup_rank_spread(skewed) == pytest.approx(math.sqrt(4 * d * d / 2))


def test_one_profile_of_two_ranks_does_not_measure_a_spread():
    assert lookup_rank_spread([lookups_by_rank(_calls([1.1, 0.9]), OPS, "cpu")]) is None
    assert lookup_rank_spread([lookups_by_rank(_calls([1.1, 0.9, 1.0]), OPS, "cpu")]) is not None


def test_tables_every_rank_looks_up_carry_no_premium():
    own = lookups_by_rank(_calls([1.0, 1.0]), OPS, "cpu")
    shared = lookups_by_rank(_calls([1.0, 1.0], group="data_parallel"), OPS, "cpu")
    assert rank_premium_s(own, 0.1) == pytest.approx(2e-3 * 0.1 / math.sqrt(math.pi))
    assert rank_premium_s(shared, 0.1) == 0.0
    assert rank_premium_s(own, None) == 0.0


def test_calibration_file_keeps_the_spread_and_refuses_a_wrong_one():
    cal = Calibration(None, None, 2, 64, dict(OPS), 0.01, lookup_rank_spread=0.08)
    assert Calibration.from_dict(cal.to_dict()).lookup_rank_spread == 0.08
    bad = dict(cal.to_dict(), lookup_rank_spread=-0.1)
    with pytest.raises(UserError, match="lookup_rank_spread"):
        Calibration.from_dict(bad, "cal.json")


T = [TableStats(f"t{i}", 100_000, 64, 20.0, feature_names=(f"t{i}",)) for i in range(4)]


def _model(spread: float | None) -> CostModel:
    topo = preset("cpu-gloo", 2)
    cal = Calibration("cpu", "gloo", 2, 512, _ops(1e-5, 2e-9), 0.01, lookup_rank_spread=spread)
    return CostModel(topo, 512, coefficients(topo, cal))


def test_a_balanced_plan_pays_for_the_spread_and_an_unbalanced_one_hardly():
    by_name = {t.name: t for t in T}
    balanced = {t.name: Choice(OptionClass(TW, "fused"), (i % 2,)) for i, t in enumerate(T)}
    lopsided = {t.name: Choice(OptionClass(TW, "fused"), (0,)) for t in T}
    model, exact = _model(0.1), _model(None)
    assert model.coeffs.measured("rank_spread") and not exact.coeffs.measured("rank_spread")
    b = model.evaluate(by_name, balanced)
    lookups = [r.compute_s - b.dense_step_s for r in b.per_rank]
    assert b.spread_s > 0.05 * max(lookups)  # ≈ 0.1 / √π of a rank's lookups
    unpriced = exact.evaluate(by_name, balanced)
    assert b.step_time_s == pytest.approx(unpriced.step_time_s + b.spread_s)
    lop = model.evaluate(by_name, lopsided)
    assert lop.spread_s < 1e-3 * b.spread_s
    # replicated tables are looked up alike on every rank: no spread
    replicated = {t.name: Choice(OptionClass(DP, "dense"), ()) for t in T}
    assert model.evaluate(by_name, replicated).spread_s == 0.0


def test_a_plan_records_and_shows_the_lateness_in_its_predicted_step():
    model = _model(0.1)
    by_name = {t.name: t for t in T}
    balanced = {t.name: Choice(OptionClass(TW, "fused"), (i % 2,)) for i, t in enumerate(T)}
    cost = model.evaluate(by_name, balanced)
    rr = plans.round_robin_table_wise(fingerprints(T), plan_topology(model.topo))
    plan = plans.loads(plans.dumps(dataclasses.replace(rr, predicted=cost.predicted())))
    assert cost.spread_s > 0 and plan.predicted is not None
    assert plan.predicted["spread_s"] == pytest.approx(cost.spread_s, abs=1e-9)
    late = f"of which {cost.spread_s * 1e3:.2f} ms the slowest rank's expected lateness"
    assert late in show(plan)


FIX = Path(__file__).parent / "fixtures"


def _evidence(name: str, per_rank_scale: list[float]) -> ProfileEvidence:
    """A 2-rank profile of `_calls`, its steps the slower rank's lookups plus 10 ms."""
    calls = _calls(per_rank_scale)
    calls = calls.assign(
        wait=0.0,
        transfer=0.0,
        calls=1,
        n_calls=1,
        ids=calls["x"],
        unique=0.0,
        bag_elems=0.0,
        far=0.0,
    )[SAMPLE_COLUMNS]
    step_s = pd.Series(0.01 + 2e-3 * max(per_rank_scale), index=range(4))
    manifest = {"world_size": 2, "device": "cpu", "backend": "gloo", "batch_size": 64}
    return ProfileEvidence(name, manifest, "cpu", 2, calls, step_s, pd.DataFrame(), 0.012)


def test_the_dense_step_is_fitted_net_of_each_profiles_own_premium():
    evidence = [_evidence("a", [1.1, 0.9]), _evidence("b", [0.9, 1.1])]
    cal = fit_evidence(evidence)
    assert cal.lookup_rank_spread == pytest.approx(math.log(1.1 / 0.9) / 2 * math.sqrt(2), rel=0.01)
    ops = dict(cal.ops)
    premium = rank_premium_s(lookups_by_rank(evidence[0].calls, ops, "cpu"), cal.lookup_rank_spread)
    assert premium > 1e-5  # the fitted line predicts the two ranks alike
    unpriced = dense_fit(evidence, [ops] * 2).dense_step_s
    assert cal.dense_step_s == pytest.approx(unpriced - premium, rel=1e-9)


def test_real_profiles_of_one_plan_measure_the_spread_the_optimizer_prices(tmp_path):
    tw = FIX / "profile_tiny_table_wise"
    again = tmp_path / "tw-again"  # the same plan profiled twice: 2 degrees of freedom
    shutil.copytree(tw, again)
    cal = fit_jointly([analyze(tw, cache=False), analyze(again, cache=False)]).calibration
    assert cal.lookup_rank_spread is not None and 0 < cal.lookup_rank_spread < 1
    stats, batch = stats_from_profile(tw)
    topo = preset("cpu-gloo", 2, 2)
    profiled = predict_plan(plans.load(FIX / "tiny_table_wise.plan.json"), stats, cal, topo, batch)
    # the profiled plan leaves one rank far ahead: it hardly pays for the spread
    assert profiled.spread_s < 1e-3 * profiled.step_time_s
    coeffs = coefficients(topo, cal)
    assert coeffs.rank_spread == cal.lookup_rank_spread and coeffs.measured("rank_spread")
