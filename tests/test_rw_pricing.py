"""Row-wise tables' output distribution (a reduce-scatter; gloo: an all-reduce) priced with its own
coefficients, fitted only on profiles that ran row-wise tables, by analogy with the all-to-all
(assumed) where none did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparselift.analysis.joint import fit_jointly
from sparselift.analysis.pipeline import analyze
from sparselift.analysis.step_model import sparse_at_target
from sparselift.calibration import A2A_KIND, RS_KIND, Calibration, read_checked
from sparselift.cli import main
from sparselift.optimizer.coefficients import ASSUMED, Linear, coefficients
from sparselift.optimizer.cost_model import CostModel, Group
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.robust import risky_class
from sparselift.optimizer.space import FUSED, RW, TW, TWRW, OptionClass
from sparselift.optimizer.table_stats import TableStats, stats_from_profile
from sparselift.optimizer.topology import preset

FIX = Path(__file__).parent / "fixtures"
TOPO = preset("cpu-gloo", 2, 2)
RW_CLS, TW_CLS = OptionClass(RW, FUSED, 2), OptionClass(TW, FUSED, 1)


@pytest.fixture(scope="module")
def analyses():
    return {n: analyze(FIX / f"profile_tiny_{n}", cache=False) for n in ("table_wise", "row_wise")}


def _linear(cal: Calibration, kind: str) -> Linear:
    fit = cal.ops[kind]
    return Linear(fit.a_s + fit.sync_s, fit.b_s)


def test_a_row_wise_profile_calibrates_the_reduce_scatter_and_row_wise_is_then_not_risky(analyses):
    cal = analyses["row_wise"].calibration  # every table row-wise, 2 ranks
    for rs in RS_KIND.values():
        assert cal.ops[rs].n > 0 and cal.ops[rs].x == "bytes" and cal.ops[rs].b_s > 0
    assert not set(RS_KIND) & set(cal.ops)  # no all-to-all of pooled embeddings ran
    coeffs = coefficients(TOPO, cal)
    assert coeffs.measured("output_dist_rs_fwd") and coeffs.measured("output_dist_rs_bwd")
    assert coeffs.output_dist_rs_fwd == _linear(cal, "output_dist_rs_fwd")
    assert coeffs.output_dist_rs_bwd == _linear(cal, "output_dist_rs_bwd")
    assert not coeffs.measured("output_dist_fwd")  # the all-to-all stays the preset's
    assert not risky_class(RW_CLS, coeffs)
    # table-row-wise's output also crosses hosts as an all-to-all: a row-wise fit is an analogy
    assert risky_class(OptionClass(TWRW, FUSED, 2), coeffs)


def test_joint_calibration_keeps_the_two_collectives_apart(analyses):
    tw, rw = analyses["table_wise"], analyses["row_wise"]
    cal = fit_jointly([tw, rw], cache=False).calibration
    # each fit is made of its own collective's calls only: the all-to-all's as on the table-wise
    # profile alone, the reduce-scatter's as on the row-wise one alone
    for kind, alone in [
        *((a2a, tw.calibration) for a2a in RS_KIND),
        *((rs, rw.calibration) for rs in A2A_KIND),
    ]:
        got, want = cal.ops[kind], alone.ops[kind]
        assert (got.a_s, got.b_s, got.n) == pytest.approx((want.a_s, want.b_s, want.n))
    # the row-wise profile's dense step still has its reduce-scatter calls taken out, priced with
    # their own fits, or with the all-to-all's where the reduce-scatter has none
    sparse = sparse_at_target(rw.evidence, cal.ops)
    by_analogy = {k: v for k, v in cal.ops.items() if k not in A2A_KIND}
    no_output = {k: v for k, v in by_analogy.items() if k not in RS_KIND}
    assert sparse > sparse_at_target(rw.evidence, no_output)
    assert sparse != pytest.approx(sparse_at_target(rw.evidence, by_analogy), rel=1e-6)
    assert sparse_at_target(rw.evidence, by_analogy) > sparse_at_target(rw.evidence, no_output)
    assert all(h.predicted_step_s > 0 for h in cal.held_out)


def test_without_reduce_scatter_fits_row_wise_is_priced_as_the_all_to_all_and_assumed(
    analyses, tmp_path
):
    # a calibration file of table-wise profiles only, as calibrations before the reduce-scatter
    # kinds were written: it loads, and prices the row-wise output with the all-to-all's line
    analyses["table_wise"].calibration.save(tmp_path / "calibration.json")
    doc = read_checked(tmp_path / "calibration.json")
    assert not set(A2A_KIND) & set(doc["ops"])
    coeffs = coefficients(TOPO, doc)
    assert coeffs.measured("output_dist_fwd") and coeffs.measured("output_dist_bwd")
    assert coeffs.output_dist_rs_fwd == coeffs.output_dist_fwd
    assert coeffs.output_dist_rs_bwd == coeffs.output_dist_bwd
    ev = coeffs.evidence_dict()
    for rs in A2A_KIND:
        assert ev[rs]["source"] == ASSUMED and "analogy" in ev[rs]["from"]
    assert risky_class(RW_CLS, coeffs)  # by analogy only
    # no calibration at all (what-if): the preset's all-to-all values, assumed, no risk rule
    preset_only = coefficients(TOPO)
    assert preset_only.output_dist_rs_fwd == preset_only.output_dist_fwd
    assert not preset_only.measured("output_dist_rs_fwd") and not risky_class(RW_CLS, preset_only)


def test_row_wise_bytes_and_fixed_costs_go_with_the_reduce_scatter_coefficients(analyses):
    stats, batch = stats_from_profile(FIX / "profile_tiny_row_wise")
    base = coefficients(TOPO, fit_jointly(list(analyses.values()), cache=False).calibration)
    dear = base.replace(
        output_dist_rs_fwd=Linear(5 * base.output_dist_rs_fwd.a_s, 7 * base.output_dist_rs_fwd.b_s)
    )
    t = stats[0]
    cheap_m, dear_m = CostModel(TOPO, batch, base), CostModel(TOPO, batch, dear)
    n = cheap_m.counts(t, RW_CLS).own
    for m, c in ((cheap_m, base), (dear_m, dear)):
        assert m.terms(t, RW_CLS).own.output_dist_fwd == pytest.approx(
            c.output_dist_rs_fwd.b_s * n.out_fwd_intra
        )
        # a table-wise table's output is the all-to-all's, whatever the reduce-scatter costs
        assert m.terms(t, TW_CLS).own.output_dist_fwd == pytest.approx(
            base.output_dist_fwd.b_s * m.counts(t, TW_CLS).own.out_fwd_intra
        )
        fixed = m.fixed_call_costs([Group("", RW, FUSED), Group("", TW, FUSED)])
        assert fixed.output_dist_fwd == pytest.approx(
            c.output_dist_rs_fwd.a_s + base.output_dist_fwd.a_s
        )


def _dominant_stats() -> list[TableStats]:
    return [
        TableStats("hot", 100_000, 32, 60.0, zipf_alpha=0.5, feature_names=("hot",)),
        TableStats("b", 2_000, 32, 1.0, feature_names=("b",)),
        TableStats("c", 5_000, 32, 2.0, feature_names=("c",)),
    ]


def test_a_dearer_reduce_scatter_makes_the_optimizer_leave_row_wise(analyses):
    """With a calibration whose reduce-scatter costs what the all-to-all does, row-wise is chosen
    for some tables; at 30 × its per-byte cost the optimizer moves some of them off row-wise.
    Each plan is the cheaper one under the coefficients it was made with."""
    cal = fit_jointly(list(analyses.values()), cache=False).calibration.to_dict()
    stats = _dominant_stats()
    made = {}
    for mult in (1.0, 30.0):
        d = json.loads(json.dumps(cal))
        for rs, a2a in A2A_KIND.items():
            d["ops"][rs] = dict(d["ops"][a2a], b_s=d["ops"][a2a]["b_s"] * mult)
        coeffs = coefficients(TOPO, d)
        assert coeffs.measured("output_dist_rs_fwd") and not risky_class(RW_CLS, coeffs)
        made[mult] = (coeffs, optimize(Inputs(stats, TOPO, 256, coeffs), time_limit_s=10).plan)
    types = {m: {t.name: t.sharding_type for t in p.tables} for m, (_, p) in made.items()}
    assert [n for n, st in types[1.0].items() if st == RW and types[30.0][n] != RW], types
    for mult, (coeffs, own) in made.items():
        other = made[30.0 if mult == 1.0 else 1.0][1]
        mine, theirs = (predict_plan(p, stats, coeffs, TOPO, 256).step_time_s for p in (own, other))
        assert mine < theirs


@pytest.mark.slow
def test_a_profiled_mixed_plan_fits_both_collectives(tmp_path):
    """tiny on 2 ranks with one table row-wise, the others table-wise: both output collectives
    are fitted, each on one call per rank and step, and row-wise is then not risky."""
    plan = json.loads((FIX / "tiny_table_wise.plan.json").read_text())
    rw = json.loads((FIX / "tiny_row_wise.plan.json").read_text())
    by = {t["name"]: t for t in rw["tables"]}
    plan["tables"] = [by["t3"] if t["name"] == "t3" else t for t in plan["tables"]]
    (tmp_path / "mixed.json").write_text(json.dumps(plan))
    out = tmp_path / "prof"
    argv = ["profile", "--workload", "tiny", "--nproc", "2", "--plan", str(tmp_path / "mixed.json")]
    assert main([*argv, "--out", str(out)]) == 0
    cal = analyze(out, cache=False).calibration
    for a2a, rs in RS_KIND.items():
        assert cal.ops[rs].n == cal.ops[a2a].n > 0
    coeffs = coefficients(TOPO, cal)
    assert coeffs.measured("output_dist_rs_fwd") and coeffs.measured("output_dist_fwd")
    assert coeffs.profiled_types == (RW, TW) and not risky_class(RW_CLS, coeffs)
    assert coeffs.output_dist_rs_fwd != coeffs.output_dist_fwd  # fitted on their own calls


def test_a_measured_type_overhead_makes_the_optimizer_run_fewer_sharding_types(analyses):
    """Priced at what the profiles measured, each model-parallel sharding type adds its
    framework work to the step; at a dear enough price the optimizer keeps one type, and each
    plan is the cheaper under the coefficients it was made with."""
    cal = fit_jointly(list(analyses.values()), cache=False).calibration.to_dict()
    # one table row-wise pays; wide one-hot tables are cheaper table-wise
    wide = [TableStats(f"w{i}", 1_000, 256, 1.0, feature_names=(f"w{i}",)) for i in range(8)]
    stats = _dominant_stats()[:1] + wide
    made = {}
    for overhead in (0.0, 0.05):
        coeffs = coefficients(TOPO, {**cal, "type_overhead_s": overhead})
        assert coeffs.type_overhead_s == overhead and coeffs.measured("type_overhead_s")
        made[overhead] = (coeffs, optimize(Inputs(stats, TOPO, 256, coeffs), time_limit_s=10).plan)

    def types(plan) -> set[str]:
        return {t.sharding_type for t in plan.tables} - {"data_parallel"}

    free, dear = made[0.0][1], made[0.05][1]
    assert len(types(free)) > 1 and len(types(dear)) == 1, (types(free), types(dear))
    steps = {
        o: [predict_plan(p, stats, c, TOPO, 256).step_time_s for p in (free, dear)]
        for o, (c, _) in made.items()
    }
    assert steps[0.0][0] < steps[0.0][1] and steps[0.05][1] < steps[0.05][0]
    # the price of a plan grows by the overhead once per type it runs
    assert steps[0.05][0] - steps[0.0][0] == pytest.approx(0.05 * len(types(free)))
