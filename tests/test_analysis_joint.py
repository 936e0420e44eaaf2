"""Several profiles of one job calibrated together: known coefficients come back, each profile is
predicted by the fit on the others, and profiles of different jobs are refused."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from sparselift.analysis.evidence import ProfileEvidence, slowed
from sparselift.analysis.fit import fit_evidence
from sparselift.analysis.job_levels import job_levels, levelled
from sparselift.analysis.joint import (
    JointFit,
    fit_jointly,
    held_out,
    held_out_lines,
    plan_options,
)
from sparselift.analysis.pipeline import analyze
from sparselift.analysis.recombine_fit import RecombineSample
from sparselift.analysis.samples import SAMPLE_COLUMNS
from sparselift.analysis.transform_fit import TransformSample
from sparselift.analysis.type_overhead import DenseFit, fit_dense
from sparselift.calibration import Calibration
from sparselift.cli import main
from sparselift.kernels import CPU_CALL_S, KERNEL_UNIT

FIX = Path(__file__).parent / "fixtures"
TW, RW = FIX / "profile_tiny_table_wise", FIX / "profile_tiny_row_wise"

# the truth the synthetic profiles are made from
A_S, B_S, KAPPA, MU = 2e-4, 4e-9, 12.0, 0.5  # lookup_fwd: a + b·(ids + κ·unique + μ·bags)
DIST_A, DIST_B = 9e-4, 3e-9  # input_dist: a + b·bytes
DENSE = 5e-3


def _evidence(
    name: str, seed: int, ranks: int, groups: list[str], per_type: float | None = None
) -> ProfileEvidence:
    """A profile's samples drawn from the truth above, each plan mixing the parts its own way;
    with `per_type`, its manifest records the groups' sharding types and each adds that much
    to every step outside the calls (as TorchRec's per-type framework work does)."""
    rng = np.random.default_rng(seed)
    rows, steps = [], range(4)
    shapes = {
        (r, g): (rng.uniform(2e4, 2e5), rng.uniform(1e3, 3e4), rng.uniform(1e4, 4e5))
        for r in range(ranks)
        for g in groups
    }
    sent = {g: rng.uniform(1e5, 2e6) for g in groups}
    for step in steps:
        for (r, g), (ids, uniq, bags) in shapes.items():
            y = A_S + B_S * (ids + KAPPA * uniq + MU * bags)
            x = ids + KERNEL_UNIT.unique_fwd * uniq + KERNEL_UNIT.bag_fwd * bags
            noise = 1 + rng.normal(0, 0.003)
            rows.append(
                (r, step, "lookup_fwd", g, x, y * noise, 0, 0, len(groups), 1, ids, uniq, bags, 0)
            )
            dist_y = DIST_A + DIST_B * sent[g]
            wait = 0.0 if r == 0 else 1e-4 * r
            rows.append((r, step, "input_dist", g, sent[g], dist_y + wait, wait, 0, 1, 1, 0, 0, 0))
    calls = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    # a rank's wait for a late peer is not the collective's cost: the step is the model's
    busy = calls.assign(y=calls["y"] - calls["wait"])
    per_rank = busy.groupby(["step", "rank", "kind"])["y"].sum().groupby(["step", "kind"]).max()
    step_s = per_rank.groupby("step").sum() + DENSE
    manifest: dict[str, Any] = {
        "world_size": ranks,
        "device": "cpu",
        "backend": "gloo",
        "batch_size": 64,
    }
    if per_type is not None:
        step_s += per_type * len(groups)
        manifest["sharding"] = [
            {"table": f"t{i}", "sharding_type": g} for i, g in enumerate(groups)
        ]
    return ProfileEvidence(
        name, manifest, "cpu", ranks, calls, step_s, pd.DataFrame(), float(step_s.min())
    )


def test_a_joint_fit_recovers_the_coefficients_two_plans_were_made_with():
    tw = _evidence("tw", 0, 4, ["table_wise"])
    rw = _evidence("rw", 1, 4, ["row_wise", "column_wise"])
    cal = fit_evidence([tw, rw])
    look = cal.ops["lookup_fwd"]
    assert look.unique_weight == pytest.approx(KAPPA, rel=0.1)
    assert look.bag_weight == pytest.approx(MU, rel=0.1)
    assert look.b_s == pytest.approx(B_S, rel=0.05)
    dist = cal.ops["input_dist"]
    # the two plans move different bytes: the fixed cost is fitted, not the kernel bench's
    assert dist.a_s == pytest.approx(DIST_A, rel=0.05)
    assert dist.a_s != CPU_CALL_S["input_dist"]
    assert dist.b_s == pytest.approx(DIST_B, rel=0.05)
    assert cal.dense_step_s == pytest.approx(DENSE, rel=0.05)
    # one plan alone cannot tell the weights apart: the kernel's stand
    alone = fit_evidence([tw]).ops["lookup_fwd"]
    assert alone.unique_weight is None and alone.bag_weight is None


def test_profiles_of_more_sharding_types_measure_what_each_type_adds_to_the_step():
    per_type = 1.5e-3
    one = _evidence("tw", 0, 4, ["table_wise"], per_type)
    two = _evidence("rw+cw", 1, 4, ["row_wise", "column_wise"], per_type)
    three = _evidence("all", 2, 4, ["table_wise", "row_wise", "column_wise"], per_type)
    cal = fit_evidence([one, two])
    assert cal.type_overhead_s == pytest.approx(per_type, rel=0.1)
    assert cal.dense_step_s == pytest.approx(DENSE, rel=0.05)
    # each profile is predicted by the fit on the other two, its own type count priced
    errors = [held_out([one, two, three], i).error for i in range(3)]
    assert max(map(abs, errors)) < 0.02, errors
    # without the per-type term, the one-type profile left out is priced at the others' residual
    flat = [
        dataclasses.replace(ev, manifest={**ev.manifest, "sharding": []}) for ev in (two, three)
    ]
    assert fit_evidence(flat).type_overhead_s is None
    assert held_out([one, *flat], 0).error > 0.05
    # profiles of as many types each cannot measure it
    assert (
        fit_evidence([one, _evidence("tw2", 3, 4, ["table_wise"], per_type)]).type_overhead_s
        is None
    )
    written = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert written.type_overhead_s == cal.type_overhead_s


def _in_job(ev: ProfileEvidence, job: str, plan: str, slower: float = 1.0) -> ProfileEvidence:
    """`ev` as profiled in side-by-side job `job` under plan `plan`, that job `slower`× as slow."""
    manifest = {**ev.manifest, "side_by_side_job": job, "sharding": [{"plan": plan}]}
    return dataclasses.replace(slowed(ev, slower), manifest=manifest)


def test_separate_jobs_are_levelled_by_the_plan_both_profiled():
    # job A: the table-wise plan; job B, 1.6× as slow: the row-wise plan and the table-wise again
    tw = _evidence("tw", 0, 4, ["table_wise"])
    evidence = [
        _in_job(_evidence("rw", 1, 4, ["row_wise", "column_wise"]), "B", "rw", 1.6),
        _in_job(tw, "B", "tw", 1.6),
        _in_job(tw, "A", "tw"),
        _in_job(_evidence("lone", 2, 4, ["table_wise"]), "C", "other", 1.3),
    ]
    levels = job_levels(evidence)
    # the first profile's job is the reference: job A ran at 1 / 1.6 of its steps
    assert [lv.level for lv in levels[:3]] == pytest.approx([1.0, 1.0, 1 / 1.6])
    assert levels[2].linked and levels[2].via == ("tw / tw",)
    assert levels[3].level == 1.0 and not levels[3].linked  # job C shares no plan
    # written before jobs had ids, a side-by-side job is known by its plans
    old = [dataclasses.replace(ev, manifest={**ev.manifest}) for ev in evidence[:3]]
    for ev, plans in zip(old, (["rw", "tw"], ["rw", "tw"], ["tw"]), strict=True):
        del ev.manifest["side_by_side_job"]
        ev.manifest["side_by_side_plans"] = plans
    assert [lv.level for lv in job_levels(old)] == pytest.approx([1.0, 1.0, 1 / 1.6])
    # fitted at one speed, the truth comes back; as measured, the slow job skews it
    cal = fit_evidence(levelled(evidence[:3], levels[:3]))
    assert cal.ops["lookup_fwd"].b_s == pytest.approx(B_S * 1.6, rel=0.05)
    assert cal.dense_step_s == pytest.approx(DENSE * 1.6, rel=0.05)
    assert cal.ops["input_dist"].a_s == pytest.approx(DIST_A * 1.6, rel=0.05)
    raw = fit_evidence(evidence[:3])
    assert raw.ops["input_dist"].a_s != pytest.approx(DIST_A * 1.6, rel=0.1)
    # the batch transform's and the recombination's timings are levelled alike
    timed = [
        dataclasses.replace(
            ev,
            transform=[TransformSample(2, 1000, 1e-3 * s)],
            recombine=[RecombineSample(500, 500, 2e-3 * s)],
        )
        for ev, s in zip(evidence, (1.6, 1.6, 1.0, 1.3), strict=True)
    ]
    at_b = levelled(timed, levels)
    assert [ev.transform[0].seconds for ev in at_b] == pytest.approx([1.6e-3] * 3 + [1.3e-3])
    assert [ev.recombine[0].seconds for ev in at_b] == pytest.approx([3.2e-3] * 3 + [2.6e-3])
    # what `analyze` prints: a line a levelled job, one for those it could not level
    joint = JointFit(cal, tuple(ev.profile for ev in evidence), None, tuple(levels))
    lines = held_out_lines(joint)
    assert "  the job of tw ran at 0.625× the steps of rw's (measured on tw / tw)" in lines[1]
    assert lines[2] == (
        "  not levelled (their jobs share no plan with rw's, fitted as measured): lone"
    )


def test_a_plan_profiled_as_two_models_levels_jobs_at_their_geometric_mean():
    # job B holds two models of the shared plan, 1.5× and 1.2× job A's step: one model alone
    # would level job B by its own offset
    tw = _evidence("tw", 0, 4, ["table_wise"])
    evidence = [
        _in_job(tw, "A", "tw"),
        _in_job(tw, "B", "tw", 1.5),
        _in_job(dataclasses.replace(tw, profile="tw-model-2"), "B", "tw", 1.2),
    ]
    levels = job_levels(evidence)
    assert [lv.level for lv in levels] == pytest.approx([1.0, 1.8**0.5, 1.8**0.5])
    assert levels[1].via == ("tw / tw + tw-model-2",)


def test_each_fixture_profile_is_predicted_by_the_fit_on_the_other():
    joint = fit_jointly([analyze(TW, cache=False), analyze(RW, cache=False)])
    cal = joint.calibration
    assert [h.profile for h in cal.held_out] == [str(TW), str(RW)]
    for h in cal.held_out:
        assert abs(h.error) < 0.15, h
    assert cal.provenance.profiles == [str(TW), str(RW)]
    # each plan's sharding type is one the other profile never ran: named with its error
    assert [h.unmeasured for h in cal.held_out] == [["table_wise tables"], ["row_wise tables"]]
    again = Calibration.from_dict(json.loads(cal.to_bytes()))
    assert [(h.profile, h.error, h.unmeasured) for h in again.held_out] == [
        (h.profile, h.error, h.unmeasured) for h in cal.held_out
    ]
    lines = held_out_lines(joint)
    assert any(
        f"left out {RW}" in ln and "no other profile ran its row_wise tables" in ln for ln in lines
    )


def test_a_held_out_profile_names_only_what_no_other_profile_ran():
    """The data-parallel plan also runs table-wise tables, which the table-wise profile measured;
    a 16-bit copy of the table-wise plan adds only its precision."""
    same_job = FIX / "profile_tiny_table_wise_same_job"
    dp = FIX / "profile_tiny_data_parallel"
    held = fit_jointly([analyze(same_job, cache=False), analyze(dp, cache=False)]).calibration
    assert [h.unmeasured for h in held.held_out] == [[], ["data_parallel tables"]]
    fp16 = {"comm_precision": {"forward": "fp16", "backward": "fp32"}}
    assert plan_options({**json.loads((TW / "manifest.json").read_text()), **fp16}) == {
        "table_wise tables",
        "16-bit comm",
    }


def test_analyze_of_two_profiles_prints_the_leave_one_out_errors(tmp_path, capsys):
    assert main(["analyze", str(TW), str(RW), "--out", str(tmp_path), "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert f"left out {TW}: predicted" in out and f"left out {RW}: predicted" in out
    written = Calibration.load(tmp_path / "calibration.json")
    assert len(written.held_out) == 2


def _other_job(tmp_path: Path) -> Path:
    other = tmp_path / "other"
    shutil.copytree(RW, other)
    m = json.loads((other / "manifest.json").read_text())
    m["batch_size"] = m["batch_size"] * 2
    (other / "manifest.json").write_text(json.dumps(m))
    return other


@pytest.mark.parametrize("command", ["analyze", "optimize"])
def test_profiles_of_different_jobs_are_refused_naming_both(tmp_path, capsys, command):
    other = _other_job(tmp_path)
    out = tmp_path / "out"
    if command == "analyze":
        argv = ["analyze", str(TW), str(other), "--out", str(out)]
    else:
        argv = ["optimize", "--profile", str(TW), "--profile", str(other), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert str(TW) in err[0] and str(other) in err[0] and "batch_size" in err[0]
    assert not out.exists()


def test_the_optimizer_counts_lookup_work_in_the_refitted_unit():
    from sparselift.optimizer.coefficients import coefficients
    from sparselift.optimizer.cost_model import CostModel
    from sparselift.optimizer.space import OptionClass
    from sparselift.optimizer.synthetic import synthetic_stats
    from sparselift.optimizer.topology import preset

    cal = fit_evidence(
        [_evidence("tw", 0, 4, ["table_wise"]), _evidence("rw", 1, 4, ["row_wise", "column_wise"])]
    )
    topo = preset("cpu-gloo", 4, 4)
    refit, kernel = coefficients(topo, cal), coefficients(topo)
    assert refit.lookup_unit.unique_fwd == cal.ops["lookup_fwd"].unique_weight
    assert refit.measured("lookup_unit") and not kernel.measured("lookup_unit")
    t = synthetic_stats(1, seed=3)[0]
    tw = OptionClass("table_wise", "fused")
    work = {
        name: CostModel(topo, 64, c).counts(t, tw).own.fwd_work
        for name, c in (("refit", refit), ("kernel", kernel))
    }
    assert work["refit"] > work["kernel"]  # κ 12 > 5 and μ 0.5 > 0.22 both add work


def test_optimize_plans_with_the_joint_calibration_of_two_profiles(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["optimize", "--profile", str(TW), "--profile", str(RW), "--no-baseline"]
    assert main([*argv, "--time-limit", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"left out {RW}: predicted" in printed
    plan = json.loads(out.read_text())
    assert plan["provenance"]["profiles"] == [str(TW), str(RW)]
    both = f"{TW} + {RW}"
    assert plan["evidence"]["lookup_bwd"] == {"source": "measured", "from": both}


def test_optimize_takes_the_calibration_analyze_fitted_on_the_same_profiles(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(TW, a)
    shutil.copytree(RW, b)
    assert main(["analyze", str(a), str(b), "--no-cache"]) == 0
    capsys.readouterr()
    argv = ["optimize", "--profile", str(a), "--profile", str(b), "--no-baseline"]
    assert main([*argv, "--time-limit", "2", "--out", str(tmp_path / "saved.json")]) == 0
    printed = capsys.readouterr().out
    assert "fitted on these 2 profiles together by `sparselift analyze`" in printed
    assert f"left out {b}: predicted" in printed and "calibrated on" not in printed
    # a profile rewritten since: fitted again, to the same plan
    later = (a / "calibration.json").stat().st_mtime + 10
    os.utime(b / "manifest.json", (later, later))
    assert main([*argv, "--time-limit", "2", "--out", str(tmp_path / "refit.json")]) == 0
    assert "calibrated on 2 profiles together" in capsys.readouterr().out
    assert (tmp_path / "saved.json").read_bytes() == (tmp_path / "refit.json").read_bytes()


def test_a_calibration_reproduces_the_steady_step_timed_after_the_window(tmp_path):
    from sparselift import plans
    from sparselift.analysis.compare import slowest_rank_steps
    from sparselift.optimizer.predict import predict_plan
    from sparselift.optimizer.table_stats import stats_from_profile
    from sparselift.optimizer.topology import preset

    prof = tmp_path / "steady"
    shutil.copytree(TW, prof)
    m = json.loads((prof / "manifest.json").read_text())
    window = slowest_rank_steps(m)[m["warmup"] : m["warmup"] + len(m["profiled_steps"])]
    steady = [0.6 * float(np.median(window)) * f for f in (0.98, 1.0, 1.01, 1.03, 0.99)]
    m["steady_step_s"] = steady
    (prof / "manifest.json").write_text(json.dumps(m))

    def predicted(cal: Calibration) -> float:
        stats, batch = stats_from_profile(TW)
        plan = plans.load(FIX / "tiny_table_wise.plan.json")
        return predict_plan(plan, stats, cal, preset("cpu-gloo", 2, 2), batch).step_time_s

    corrected = analyze(prof, cache=False).calibration
    plain = analyze(TW, cache=False).calibration
    assert corrected.provenance.profiler_inflation == pytest.approx(1 / 0.6, rel=0.02)
    assert corrected.provenance.steady_step_s_median == pytest.approx(float(np.median(steady)))
    assert plain.provenance.profiler_inflation is None
    # the optimizer's model of the profiled plan: the steady step, not the profiled window's
    assert predicted(corrected) == pytest.approx(float(np.median(steady)), rel=0.1)
    assert predicted(plain) > 1.3 * float(np.median(steady))


def test_lookups_are_scaled_by_their_kernels_own_steady_seconds_not_the_steps(tmp_path):
    # the window ran 1/0.6 as slow as the steady steps, but the kernels themselves were timed:
    # rank 0's as fast in the window as after it, rank 1's backward 20 % faster after it. Their
    # traced lookups are scaled by that, everything else by the step's inflation.
    from sparselift.analysis.compare import slowest_rank_steps

    def profile(name: str, lookup_s: list | None) -> Path:
        prof = tmp_path / name
        shutil.copytree(TW, prof)
        m = json.loads((prof / "manifest.json").read_text())
        window = slowest_rank_steps(m)[m["warmup"] : m["warmup"] + len(m["profiled_steps"])]
        m["steady_step_s"] = [0.6 * float(np.median(window))] * 5
        m["lookup_s"] = lookup_s
        (prof / "manifest.json").write_text(json.dumps(m))
        return prof

    kernels = [
        {"window": [[1e-3, 4e-3]] * 3, "steady": [[1e-3, 4e-3]] * 5},
        {"window": [[1e-3, 4e-3]] * 3, "steady": [[1e-3, 3.2e-3]] * 5},
    ]
    timed = analyze(profile("timed", kernels), cache=False).evidence
    alike = analyze(profile("alike", None), cache=False).evidence
    assert timed.inflation == pytest.approx(alike.inflation) == pytest.approx(1 / 0.6, rel=0.02)
    assert timed.lookup_scale == {
        (0, "lookup_fwd"): 1.0,
        (0, "lookup_bwd"): 1.0,
        (1, "lookup_fwd"): 1.0,
        (1, "lookup_bwd"): pytest.approx(0.8),
    }
    assert alike.lookup_scale == {}
    ratio = timed.calls["y"] / alike.calls["y"]
    look = timed.calls["kind"].isin(["lookup_fwd", "lookup_bwd"])
    slower = (timed.calls["rank"] == 1) & (timed.calls["kind"] == "lookup_bwd")
    assert look.any() and (~look).any() and slower.any()
    assert np.allclose(ratio[look & ~slower], alike.inflation)
    assert np.allclose(ratio[slower], 0.8 * alike.inflation)
    assert np.allclose(ratio[~look], 1.0)
    # and the calibration still closes on the steady step: what the lookups gain, the rest loses
    assert analyze(profile("timed2", kernels), cache=False).calibration.dense_step_s < (
        analyze(profile("alike2", None), cache=False).calibration.dense_step_s
    )


def _output_dist(name: str, seed: int, b_s: float, precision: str) -> ProfileEvidence:
    """A profile of pooled distributions only: a + b·bytes per call, at `precision` forward."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(4):
        for g in ("table_wise", "row_wise"):
            x = rng.uniform(1e5, 3e6)  # a collective: every rank moves as much
            y = DIST_A + b_s * x
            for r in range(2):
                rows.append((r, step, "output_dist_fwd", g, x, y, 0.0, 0, 2, 1, 0, 0, 0, 0))
    calls = pd.DataFrame(rows, columns=SAMPLE_COLUMNS)
    step_s = calls.groupby(["step", "rank"])["y"].sum().groupby("step").max() + DENSE
    manifest = {
        "world_size": 2,
        "device": "cpu",
        "batch_size": 64,
        "comm_precision": {"forward": precision, "backward": "fp32"},
    }
    return ProfileEvidence(
        name, manifest, "cpu", 2, calls, step_s, pd.DataFrame(), float(step_s.min())
    )


def test_profiles_at_fp32_and_fp16_price_what_16_bits_cost():
    from sparselift.analysis.joint import fit_profiles
    from sparselift.optimizer.choose import choose_precision
    from sparselift.optimizer.coefficients import Linear, coefficients
    from sparselift.optimizer.cost_model import CostModel
    from sparselift.optimizer.space import OptionClass, PlanWide
    from sparselift.optimizer.synthetic import synthetic_stats
    from sparselift.optimizer.topology import preset

    net = 1.2e-9  # seconds per element: on this host 16 bits cost more than they save
    b32 = 2e-10  # below the preset's wire time per byte (the forward of criteo-kaggle on gloo)
    cal = fit_profiles(
        [_output_dist("fp32", 0, b32, "fp32"), _output_dist("fp16", 1, b32 + net / 4, "fp16")]
    )
    assert cal.ops["output_dist_fwd"].b_s == pytest.approx(b32, rel=0.02)
    assert cal.ops["qcomm_quantize"].b_s == pytest.approx(net, rel=0.05)
    assert cal.dense_step_s == pytest.approx(DENSE, rel=0.05)
    # the optimizer prices a 16-bit forward distribution as it measured
    topo = preset("cpu-gloo", 2, 2)
    coeffs = coefficients(topo, cal)
    assert coeffs.measured("quantize_b_s")
    model = CostModel(topo, 64, coeffs)
    t = synthetic_stats(1, seed=5)[0]
    tw = OptionClass("table_wise", "fused")
    out32 = model.terms(t, tw, PlanWide()).remote_intra.output_dist_fwd
    out16 = model.terms(t, tw, PlanWide(forward="fp16")).remote_intra.output_dist_fwd
    elems = model.counts(t, tw).remote_intra.out_fwd_intra / 4
    assert out16 - out32 == pytest.approx(net * elems, rel=0.05)
    # … and a backward one alike, though its per-byte cost is above the wire's (the net was
    # measured over both directions; the wire's share of a byte is not known apart)
    dear = CostModel(topo, 64, coeffs.replace(output_dist_bwd=Linear(1e-4, 5 * coeffs.wire_b_s)))
    at16 = PlanWide(forward="fp16", backward="fp16")
    bwd32 = dear.terms(t, tw, PlanWide()).remote_intra.output_dist_bwd
    bwd16 = dear.terms(t, tw, at16).remote_intra.output_dist_bwd
    elems = dear.counts(t, tw).remote_intra.out_bwd_intra / 4
    assert bwd16 - bwd32 == pytest.approx(net * elems, rel=0.05)
    assert choose_precision(dear) == PlanWide()  # 16 bits measured dearer: in neither direction


@pytest.mark.parametrize(("step_scale", "counted"), [(0.8, True), (1.0, False)])
def test_a_16_bit_saving_is_counted_only_where_the_steps_measured_it(tmp_path, step_scale, counted):
    # The calls say 16 bits save 0.8 ns an element. The 16-bit profile's steady steps measured
    # faster than its fp32 twin's (same plan): the saving is counted on. Measured alike: the
    # calls' saving is the window's noise as far as the steps can tell, and 16 bits buy nothing.
    from test_analysis_compare import STEADY, _profile

    from sparselift.analysis.joint import fit_profiles
    from sparselift.analysis.precision_fit import measured_faster

    b32, net = 3e-9, -0.8e-9
    d32 = _profile(tmp_path, "fp32", after=STEADY)
    d16 = _profile(tmp_path, "fp16", step_scale, after=STEADY)
    ev = [
        _output_dist(str(d32), 0, b32, "fp32"),
        _output_dist(str(d16), 1, b32 + net / 4, "fp16"),
    ]
    assert measured_faster(ev) is counted
    q = fit_profiles(ev).ops["qcomm_quantize"].b_s
    assert q == (pytest.approx(net, rel=0.05) if counted else 0.0)
    # a 16-bit profile of another plan is no twin: nothing measured
    ev[1].manifest["sharding"] = {"t0": "row_wise"}
    assert not measured_faster(ev)


def test_16_bits_are_priced_as_their_paired_steps_paid_not_as_the_window_timed_them(tmp_path):
    # The window's calls say 16 bits save 0.8 ns an element; in every round of their side-by-side
    # job the 16-bit model stepped 2 % slower than the fp32 one: the net is that cost per element
    # its output distributions moved a step. Unpaired (two jobs), the calls' fit stands.
    from test_analysis_compare import _profile, _side_by_side

    from sparselift.analysis.joint import fit_profiles

    rounds = [1.0, 1.1, 0.97, 1.05, 1.02, 0.99]
    at32 = [[0.0100 * f, 0.0101 * f] for f in rounds]
    slow = [[t * 1.02 for t in turn] for turn in at32]
    b32, net = 3e-9, -0.8e-9

    def model(name: str, job: str, turns: list[list[float]], precision: str) -> ProfileEvidence:
        d = _side_by_side(_profile(tmp_path, name), job, turns)
        return _output_dist(str(d), 0, b32 + (net / 4 if precision == "fp16" else 0), precision)

    ev = [model("fp32", "job1", at32, "fp32"), model("fp16", "job1", slow, "fp16")]
    elements = ev[1].calls.groupby(["step", "rank"])["x"].sum().median() / 4
    step32 = statistics.median(t for turn in at32 for t in turn)
    paid = fit_profiles(ev).ops["qcomm_quantize"].b_s
    assert paid == pytest.approx(0.02 * step32 / elements, rel=0.02)
    apart = [model("fp32b", "job2", at32, "fp32"), model("fp16b", "job3", slow, "fp16")]
    assert fit_profiles(apart).ops["qcomm_quantize"].b_s == 0.0  # a saving not measured


def test_16_bits_must_beat_every_fp32_model_of_their_job(tmp_path):
    # One side-by-side job: the fp32 plan as two models, 16 bits 7 % faster than model 1 in
    # every round and as fast as model 2 (model 1 landed slow): not measured faster. Against
    # model 1 alone, or a model 2 that is as slow, it is.
    from test_analysis_compare import _profile, _side_by_side

    from sparselift.analysis.precision_fit import measured_faster

    rounds = [1.0, 1.1, 0.97, 1.05, 1.02, 0.99]
    even = [[0.0100 * f, 0.0101 * f] for f in rounds]
    slow = [[t * 1.07 for t in turn] for turn in even]

    def model(name: str, turns: list[list[float]], precision: str) -> ProfileEvidence:
        d = _side_by_side(_profile(tmp_path, name), "job1", turns)
        return _output_dist(str(d), 0, 3e-9, precision)

    low = model("fp16", even, "fp16")
    assert measured_faster([model("m1", slow, "fp32"), low])
    assert not measured_faster([model("m1b", slow, "fp32"), model("m2", even, "fp32"), low])
    assert measured_faster([model("m1c", slow, "fp32"), model("m2b", slow, "fp32"), low])


def test_a_calibration_without_the_pipelines_overhead_loads_with_the_presets_assumed(tmp_path):
    from sparselift.errors import UserError
    from sparselift.optimizer.coefficients import coefficients
    from sparselift.optimizer.robust import pipeline_measured, pipeline_pays
    from sparselift.optimizer.topology import preset

    topo = preset("cpu-gloo", 2, 2)
    old = {
        "format": "sparselift-calibration",
        "version": 1,
        "device": "cpu",
        "ops": {},
        "pipeline_overlap": 0.5,  # fitted net of the preset's overhead, before it was measured
        "provenance": {"profile": "/p/base"},
    }
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(old))
    cal = Calibration.load(path)
    assert cal.pipeline_overhead_s is None and cal.pipeline_profiles == []
    k = coefficients(topo, cal)
    assert k.pipeline_overhead_s == topo.pipeline_overhead_s
    assert k.measured("pipeline_overlap") and not k.measured("pipeline_overhead_s")
    assert k.evidence_dict()["pipeline_overhead_s"]["source"] == "assumed"
    assert pipeline_measured(k) and pipeline_pays(k)  # its overlap was the low end's: it decides
    # a two-pipeline calibration: both measured, from the two profiles, and the value used
    new = dict(old, pipeline_overhead_s=2e-4, pipeline_profiles=["/p/base", "/p/sd"])
    again = Calibration.from_dict(json.loads(Calibration.from_dict(new).to_bytes()))
    assert again.pipeline_overhead_s == 2e-4 and again.pipeline_profiles == ["/p/base", "/p/sd"]
    k2 = coefficients(topo, again)
    assert k2.pipeline_overhead_s == 2e-4 != topo.pipeline_overhead_s
    for name in ("pipeline_overlap", "pipeline_overhead_s"):
        assert k2.evidence_dict()[name] == {"source": "measured", "from": "/p/base + /p/sd"}
    assert pipeline_measured(k2) and pipeline_pays(k2)
    # measured no faster: its overlap still prices plans, but the pipeline is not chosen
    slower = Calibration.from_dict(
        json.loads(Calibration.from_dict(dict(new, pipeline_pays=False)).to_bytes())
    )
    assert slower.pipeline_pays is False and coefficients(topo, slower).pipeline_overlap == 0.5
    assert pipeline_measured(coefficients(topo, slower)) and not pipeline_pays(
        coefficients(topo, slower)
    )
    with pytest.raises(UserError, match="pipeline_pays must be true or false"):
        Calibration.from_dict(dict(new, pipeline_pays="yes"), str(path))
    with pytest.raises(UserError, match="pipeline_profiles must be a list of strings"):
        Calibration.from_dict(dict(new, pipeline_profiles="/p/base"), str(path))
    with pytest.raises(UserError, match="pipeline_overhead_s must be a number"):
        Calibration.from_dict(dict(new, pipeline_overhead_s="1ms"), str(path))


def test_a_type_never_saves_framework_work_and_bad_input_is_refused():
    assert fit_dense([5e-3, 4e-3], [1, 2]) == DenseFit(5e-3, 0.0)
    assert fit_dense([5e-3, 6e-3, 9e-3], [1, 1, 3]).type_overhead_s == pytest.approx(1.75e-3)
    with pytest.raises(ValueError):
        fit_dense([], [])
    with pytest.raises(ValueError):
        fit_dense([1e-3], [1, 2])
