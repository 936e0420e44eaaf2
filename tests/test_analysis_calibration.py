"""Calibration and prediction on the two fixture plans (tiny, 2 ranks, 6 profiled steps)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from sparselift import plans
from sparselift.analysis.dense_backward import dp_allreduce_fit
from sparselift.analysis.fit import _fit_calls, sync_wait
from sparselift.analysis.pipeline import analyze, write_outputs
from sparselift.calibration import FORMAT, RS_KIND, UNITS, Calibration, OpFit, read_checked
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.table_stats import stats_from_profile
from sparselift.optimizer.topology import preset

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def analyses():
    return {n: analyze(FIX / f"profile_tiny_{n}", cache=False) for n in ("table_wise", "row_wise")}


def _error(analyses, cal_on, target):
    """Held-out error of the optimizer's cost model (what the solver minimizes), calibrated on
    `cal_on`."""
    cal = analyses[cal_on].calibration.to_dict()
    stats, batch = stats_from_profile(FIX / f"profile_tiny_{target}")
    pred = predict_plan(
        plans.load(FIX / f"tiny_{target}.plan.json"), stats, cal, preset("cpu-gloo", 2, 2), batch
    ).step_time_s
    meas = analyses[target].steps.groupby("step")["dur_s"].max().min()
    return (pred - meas) / meas


def test_fit_calls_uses_sizes_when_they_differ_and_the_measured_fixed_cost_otherwise():
    a, b = _fit_calls([1, 2, 3, 4], [3, 5, 7, 9])
    assert (a, b) == pytest.approx((1, 2))
    # sizes that determine the intercept: the samples' own, not the prior's
    assert _fit_calls([1, 2, 3, 4], [3, 5, 7, 9], fixed=0.5) == pytest.approx((1, 2))
    # an intercept the samples leave uncertain (1.5 ± 1.2): at most the prior
    assert _fit_calls([1, 2, 3, 4], [3, 6, 6, 9], fixed=0.5) == pytest.approx(
        (0.5, (2.5 * 1 + 5.5 * 2 + 5.5 * 3 + 8.5 * 4) / 30)
    )
    # time does not grow: all fixed
    assert _fit_calls([1, 2, 4], [3, 3, 3]) == pytest.approx((3, 0))
    # one size, no prior: per unit
    assert _fit_calls([5, 5, 5], [10, 10, 10]) == (0.0, 2.0)
    # one size: the prior, rest per unit
    assert _fit_calls([5, 5, 5], [10, 10, 10], fixed=4.0) == (4.0, 1.2)
    assert _fit_calls([5, 5], [1, 1], fixed=4.0).a_s == 1.0  # never more than a call took


def test_one_slow_allreduce_does_not_price_every_data_parallel_table():
    # 8 allreduces of 1 MB, 1 ms of transfer each (1e-9 s a byte; the rank's own span adds its wait
    # for the peer), but one that a late peer thread made 10 ms long: a mean would say 2.1e-9
    ms = [1e-3] * 7 + [10e-3]
    dp = pd.DataFrame(
        {
            "kind": "dp_allreduce",
            "part": "collective",
            "bytes": 1e6,
            "transfer_s": ms,
            "dur_s": [t + 5e-3 for t in ms],
        }
    )
    other = pd.DataFrame(
        {
            "kind": ["dp_allreduce", "lookup_fwd"],
            "part": ["wait", "compute"],
            "bytes": [0, 1e6],
            "transfer_s": [None, None],
            "dur_s": [1.0, 1.0],
        }
    )
    fit = dp_allreduce_fit(pd.concat([dp, other], ignore_index=True))
    assert fit.b_s == pytest.approx(1e-9) and fit.n == 8
    assert dp_allreduce_fit(other) is None


def _allreduces(sizes_ms: dict[float, list[float]]) -> pd.DataFrame:
    rows = [(b, t * 1e-3) for b, ts in sizes_ms.items() for t in ts]
    return pd.DataFrame(
        {
            "kind": "dp_allreduce",
            "part": "collective",
            "bytes": [b for b, _ in rows],
            "transfer_s": [t for _, t in rows],
            "dur_s": [t for _, t in rows],
        }
    )


def test_the_tables_allreduce_call_is_told_from_its_bytes_where_sizes_differ():
    # the dense module's 30 KB call and the tables' own 1 MB call, each 5 ms of latency plus
    # 2 ns a byte: the line through them gives both terms
    fit = dp_allreduce_fit(_allreduces({30e3: [5.06, 5.06, 90.0], 1e6: [7.0, 7.0]}))
    assert fit.a_s == pytest.approx(5e-3) and fit.b_s == pytest.approx(2e-9)
    assert not fit.bound
    # larger calls no dearer (ranks sharing cores wait out their latency): a call's price only
    flat = dp_allreduce_fit(_allreduces({30e3: [6.0], 60e3: [5.0], 1e6: [5.5]}))
    assert flat.b_s == 0.0 and flat.a_s == pytest.approx(5.5e-3)
    # a size whose calls were never timed is left out; none timed at all: no fit
    untimed = _allreduces({30e3: [5.06], 1e6: [7.0], 5e6: [float("nan")]})
    assert dp_allreduce_fit(untimed).a_s == pytest.approx(5e-3)
    assert dp_allreduce_fit(_allreduces({1e6: [float("nan")]})) is None


def test_one_size_prices_a_small_tables_call_and_a_large_tables_bytes_at_the_most():
    # only the dense module's 1 MB call, 4 ms: a 10 KB table still pays a call, and 10 MB pay
    # its rate per byte (neither is known apart from the other)
    fit = dp_allreduce_fit(_allreduces({1e6: [4.0, 4.0, 4.0]}))
    assert fit.a_s == pytest.approx(4e-3) and fit.b_s == pytest.approx(4e-9)
    cost = fit.cost
    assert cost(10e3) >= 4e-3 and cost(10e6) >= 40e-3
    # the plan's evidence says it is a bound, not a line told apart
    cal = Calibration("cpu", "gloo", 2, 64, {"dp_allreduce": fit}, None)
    evidence = coefficients(preset("cpu-gloo", 2), cal).evidence_dict()["dp_allreduce"]
    assert evidence["source"] == "measured" and "a bound" in evidence["from"]
    read = Calibration.from_dict(cal.to_dict(), "calibration.json").ops["dp_allreduce"]
    assert read.bound


def _waits(waits_by_rank):
    return pd.DataFrame(
        [
            dict(rank=r, step=t, group="table_wise", wait=w)
            for r, ws in enumerate(waits_by_rank)
            for t, w in enumerate(ws)
        ]
    )


def test_a_collective_is_priced_for_ranks_arriving_at_random_not_for_steady_imbalance():
    # rank 1 always waits 3 ms for rank 0 (imbalance: the makespan prices it), nothing random
    assert sync_wait(_waits([[0.0] * 6, [3e-3] * 6])) == pytest.approx(0.0)
    # on top of it, rank 0 is 2 ms late on half the steps, rank 1 on the other half: each step's
    # latest rank is 1 ms behind the ranks' mean
    r0 = [0.0, 2e-3, 0.0, 2e-3, 0.0, 2e-3]
    r1 = [5e-3, 3e-3, 5e-3, 3e-3, 5e-3, 3e-3]
    assert sync_wait(_waits([r0, r1])) == pytest.approx(1e-3)
    assert sync_wait(_waits([r0[:2], r1[:2]])) == 0.0  # too few steps to tell
    # the optimizer pays it with every call of that distribution
    cal = {
        "device": "cpu",
        "ops": {"output_dist_fwd": {"x": "bytes", "a_s": 3e-4, "b_s": 2e-9, "sync_s": 1e-3}},
    }
    assert coefficients(preset("cpu-gloo", 2, 2), cal).output_dist_fwd.a_s == pytest.approx(1.3e-3)


def test_calibration_file_roundtrip(analyses, tmp_path):
    a = analyses["table_wise"]
    write_outputs(a, tmp_path)
    d = json.loads((tmp_path / "calibration.json").read_text())
    assert d["format"] == FORMAT and d["version"] == 1 and d["world_size"] == 2
    # a table-wise plan runs every kind but the row-wise types' reduce-scatter
    assert set(UNITS) - set(RS_KIND.values()) == set(d["ops"]) & set(UNITS)
    for v in d["ops"].values():
        assert {"x", "a_s", "b_s", "r2", "n", "overlap", "sync_s"} <= set(v) and 0 <= v[
            "overlap"
        ] <= 1
        assert v["sync_s"] >= 0 and (v["sync_s"] == 0 or v["x"] == "bytes")
    cal = read_checked(tmp_path / "calibration.json")
    assert cal["dense_step_s"] == d["dense_step_s"] > 0
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="bad.json"):
        read_checked(tmp_path / "bad.json")
    d["ops"]["input_dist"]["sync_s"] = "slow"
    (tmp_path / "bad2.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="bad2.json: op 'input_dist': sync_s must be a number"):
        read_checked(tmp_path / "bad2.json")


def test_one_calibration_type_reads_what_the_analysis_writes(analyses, tmp_path):
    cal = analyses["row_wise"].calibration
    cal.save(tmp_path / "calibration.json")
    back = Calibration.load(tmp_path / "calibration.json")
    assert back == cal and back.to_bytes() == (tmp_path / "calibration.json").read_bytes()
    topo = preset("cpu-gloo", 2, 2)
    assert coefficients(topo, back) == coefficients(topo, cal.to_dict())
    assert isinstance(back.ops["input_dist"], OpFit) and back.provenance.samples > 0
    # a hand-written calibration needs only ops; what is absent is "not measured"
    bare = Calibration.from_dict({"ops": {"input_dist": {"a_s": 1e-3, "b_s": 1e-9}}})
    assert bare.device is None and bare.dense_step_s is None and bare.ops["input_dist"].x == ""
    d = cal.to_dict()
    d["world_size"] = "two"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match="bad.json: world_size must be an integer"):
        Calibration.load(tmp_path / "bad.json")


def test_predicts_its_own_plan(analyses):
    for n in analyses:
        assert abs(_error(analyses, n, n)) < 0.02


def test_predicts_held_out_plans_within_target(analyses):
    """Calibrated on one plan, the model predicts the other's fastest step within 10 % both ways."""
    assert abs(_error(analyses, "table_wise", "row_wise")) < 0.10
    assert abs(_error(analyses, "row_wise", "table_wise")) < 0.10
