"""Robust where evidence is missing: no dominated UVM caching, no unmeasured pipeline or
precision, the secondary objective, and every plan's record of its coefficients' evidence.

Real solver, real cost model; the coefficients are made to price the risky option as free (or
cheaper than it is), so that only the rules under test keep it out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparselift import plans
from sparselift.cli import main
from sparselift.optimizer.coefficients import (
    COEFFICIENT_NAMES,
    Linear,
    coefficients,
)
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.feasibility import feasible_classes
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.planio import choices_from_plan
from sparselift.optimizer.problem import Problem
from sparselift.optimizer.robust import (
    RISK_TOLERANCE,
    drop_dominated_uvm,
    gate_precision,
    robust_problem,
)
from sparselift.optimizer.solver import solve
from sparselift.optimizer.space import FUSED, UVM_CACHING, Choice, OptionClass, PlanWide
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset


def _big_tables(topo, share: float, n: int, dim: int = 64) -> list[TableStats]:
    """`n` tables whose fp32 weights and row state take `share` of a rank's usable HBM each."""
    rows = int(share * topo.usable(topo.hbm_bytes) / (4 * dim + 4))
    return [
        TableStats(f"big{i}", rows, dim, 2.0 + i, zipf_alpha=1.1, feature_names=(f"big{i}",))
        for i in range(n)
    ]


def _uvm_tables(choices) -> list[str]:
    return sorted(n for n, ch in choices.items() if ch.cls.kernel == UVM_CACHING)


# ------------------------------------------------------------------------------ (a) UVM not free
def test_uvm_is_never_chosen_where_fused_fits_even_when_the_model_prices_it_cheaper():
    topo = preset("h100x8", 2)
    stats = _big_tables(topo, 0.05, 3)  # big enough for UVM classes, ample HBM
    # miss cost below zero: the model prices UVM caching *cheaper* than fused, so only the rule
    # keeps it out (the old solve chose UVM for every table here)
    free = coefficients(topo).replace(uvm_miss_b_s=-1e-9)
    model = CostModel(topo, 512, free)
    classes = feasible_classes(model, stats, PlanWide())
    assert any(c.kernel == UVM_CACHING for cs in classes.values() for c in cs)
    old = solve(Problem(stats, model, PlanWide(), classes), time_limit_s=5)
    assert _uvm_tables(old.choices)  # what the rule prevents
    res = optimize(Inputs(stats, topo, 512, free), time_limit_s=5)
    assert all(t.compute_kernel != UVM_CACHING for t in res.plan.tables)
    # and at a miss cost of 0 (UVM exactly free) too
    zero = optimize(Inputs(stats, topo, 512, free.replace(uvm_miss_b_s=0.0)), time_limit_s=5)
    assert all(t.compute_kernel != UVM_CACHING for t in zero.plan.tables)


# ------------------------------------------------------------------------- (b) memory forces it
def test_uvm_is_chosen_when_memory_forces_it_and_only_where_fused_does_not_fit():
    topo = preset("h100x8", 2)
    # 4 tables of 55 % of a rank's HBM on 2 ranks: no fused plan fits (220 % of 200 %)
    stats = _big_tables(topo, 0.55, 4)
    coeffs = coefficients(topo).replace(uvm_miss_b_s=0.0)
    res = optimize(Inputs(stats, topo, 512, coeffs), time_limit_s=10)
    kernels = [t.compute_kernel for t in res.plan.tables]
    assert UVM_CACHING in kernels
    cap = topo.usable(topo.hbm_bytes)
    assert all(r.memory_bytes <= cap for r in res.cost.per_rank)
    # no UVM table could have been fused at the same ranks (memory is what forces each)
    model = CostModel(topo, 512, coeffs)
    p = robust_problem(stats, model, res.cost.plan_wide, feasible_classes(model, stats, PlanWide()))
    choices = {s.name: res.solution.choices[s.name] for s in stats}
    assert drop_dominated_uvm(p, choices, res.plan.pipeline) == choices
    for name in _uvm_tables(choices):
        ch = choices[name]
        fused = {
            **choices,
            name: Choice(
                OptionClass(ch.cls.sharding_type, FUSED, ch.cls.shards), ch.ranks, ch.host
            ),
        }
        cost = model.evaluate(p.by_name, fused, res.cost.plan_wide)
        assert max(r.memory_bytes for r in cost.per_rank) > cap


def test_a_dominated_uvm_choice_is_switched_to_fused():
    topo = preset("h100x8", 2)
    stats = _big_tables(topo, 0.05, 2)
    model = CostModel(topo, 512, coefficients(topo))
    p = robust_problem(stats, model, PlanWide(), feasible_classes(model, stats, PlanWide()))
    uvm = OptionClass("table_wise", UVM_CACHING, 1, 0.2)
    start = {"big0": Choice(uvm, (0,)), "big1": Choice(OptionClass("table_wise", FUSED), (1,))}
    out = drop_dominated_uvm(p, start, "base")
    assert out["big0"] == Choice(OptionClass("table_wise", FUSED), (0,))


# ------------------------------------------------------------------------------- (c) pipeline
def _dear_input_dist(k, factor: float = 50.0):
    return k.replace(input_dist=Linear(k.input_dist.a_s, factor * k.input_dist.b_s))


TABLES = [
    TableStats(f"t{i}", 2_000 * (i + 1), 32, 8.0 + 4 * i, feature_names=(f"t{i}",))
    for i in range(4)
]


def test_pipeline_is_base_while_its_overlap_is_assumed():
    topo = preset("cpu-gloo", 2)
    # the preset says the pipeline hides all of a dear input_dist: it would pay, if true
    k = _dear_input_dist(coefficients(topo)).replace(pipeline_overlap=1.0, pipeline_overhead_s=0.0)
    old = solve(
        Problem(
            TABLES,
            CostModel(topo, 1024, k),
            PlanWide(),
            feasible_classes(CostModel(topo, 1024, k), TABLES, PlanWide()),
        ),
        time_limit_s=5,
    )
    assert old.pipeline == "sparse-dist"  # what the rule prevents
    res = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5)
    assert res.plan.pipeline == "base"
    assert any("pipeline base" in line for line in res.notes)


@pytest.mark.parametrize("pays", [True, False])
def test_pipeline_is_sparse_dist_only_where_the_profiles_measured_it_faster(pays):
    topo = preset("cpu-gloo", 2)
    cal = {
        "device": "cpu",
        "ops": {},
        "pipeline_overlap": 0.9,
        "pipeline_pays": pays,
        "provenance": {"profile": "/profiles/tiny-sparse-dist"},
    }
    k = _dear_input_dist(coefficients(topo, cal)).replace(pipeline_overhead_s=0.0)
    # a dear allreduce keeps the tables model-parallel: there is an input_dist to hide
    k = k.replace(dp_allreduce=Linear(k.dp_allreduce.a_s, 1e3 * k.dp_allreduce.b_s))
    assert k.measured("pipeline_overlap")
    res = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5)
    # the measured overlap prices sparse-dist faster either way; it is chosen only where the
    # profiles measured it faster
    choices, wide = choices_from_plan(res.plan, topo)
    model, by = CostModel(topo, 1024, k), {t.name: t for t in TABLES}
    base, sd = (PlanWide(wide.forward, wide.backward, p) for p in ("base", "sparse-dist"))
    assert (
        model.evaluate(by, choices, sd).step_time_s < model.evaluate(by, choices, base).step_time_s
    )
    assert res.plan.pipeline == ("sparse-dist" if pays else "base")
    assert any("not measured faster" in line for line in res.notes) is not pays
    assert res.plan.evidence["pipeline_overlap"] == {
        "source": "measured",
        "from": "/profiles/tiny-sparse-dist",
    }


@pytest.mark.parametrize(
    ("runs", "field", "dear"),
    [
        ({"comm_precision": {"forward": "fp16", "backward": "fp16"}}, "quantize_b_s", 1e-8),
        ({"pipeline": "sparse-dist"}, "pipeline_overhead_s", 0.005),
    ],
    ids=["16-bit", "sparse-dist"],
)
def test_a_kept_profiled_plan_drops_an_option_only_where_measured_not_to_pay(runs, field, dear):
    # The profiled plan runs an option that costs more than it saves. Nothing beats the plan by
    # min_gain, so it is kept as it is: without the option where profiles measured that cost,
    # with it where they did not (dropping it then would be a choice without evidence too).
    from sparselift.optimizer.torchrec_baseline import torchrec_baseline_plan

    topo = preset("cpu-gloo", 2)
    base = torchrec_baseline_plan(TABLES, topo, 1024)  # fp32, base pipeline
    current = plans.Plan.from_dict({**base.to_dict(), **runs}, "test")
    measured = {  # what each option's pay-off is measured from
        "quantize_b_s": ("quantize_b_s", "output_dist_fwd", "output_dist_bwd"),
        "pipeline_overhead_s": ("pipeline_overlap", "pipeline_overhead_s"),
    }[field]
    k = coefficients(topo).replace(pipeline_overlap=0.0, **{field: dear})
    for evidence, kept in ((k.with_evidence("measured", "p", measured), base), (k, current)):
        res = optimize(
            Inputs(TABLES, topo, 1024, evidence), time_limit_s=5, min_gain=10.0, current=current
        )
        assert res.kept_baseline and res.plan.tables == current.tables
        assert (res.plan.comm_precision, res.plan.pipeline) == (
            kept.comm_precision,
            kept.pipeline,
        )
        assert any("measured not to pay" in line for line in res.notes) == (kept is base)


@pytest.mark.parametrize("pays", [True, False])
def test_a_kept_sparse_dist_plan_drops_the_pipeline_measured_no_faster(pays):
    # the measured overlap prices sparse-dist faster for the profiled plan; nothing beats the
    # plan by min_gain, so it is kept: under sparse-dist only where the profiles measured it faster
    from sparselift.optimizer.torchrec_baseline import torchrec_baseline_plan

    topo = preset("cpu-gloo", 2)
    base = torchrec_baseline_plan(TABLES, topo, 1024)
    current = plans.Plan.from_dict({**base.to_dict(), "pipeline": "sparse-dist"}, "test")
    k = _dear_input_dist(coefficients(topo)).replace(
        pipeline_overlap=0.9, pipeline_overhead_s=0.0, pipeline_pays=pays
    )
    k = k.with_evidence("measured", "p", ("pipeline_overlap", "pipeline_overhead_s"))
    res = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5, min_gain=10.0, current=current)
    assert res.kept_baseline and res.plan.tables == current.tables
    assert res.plan.pipeline == ("sparse-dist" if pays else "base")


# ----------------------------------------------------------------------------- precision gate
def test_sixteen_bit_needs_measured_costs_or_torchrec_agreement():
    topo = preset("h100x8", 16)
    model = CostModel(topo, 512, coefficients(topo))
    wanted = PlanWide("fp16", "bf16")
    assert gate_precision(model, wanted)[2]  # what-if: TorchRec is consulted
    # a profile of this hardware that measured other things but not the quantize cost: fp32
    cal = {"device": "cuda", "ops": {}, "dense_step_s": 0.01, "provenance": {"profile": "p"}}
    measured_other = CostModel(topo, 512, coefficients(topo, cal))
    wide, notes, consult = gate_precision(measured_other, wanted)
    assert wide == PlanWide() and not consult and "did not measure" in notes[0]
    # measured quantize cost and inter-host bytes: kept
    ok = coefficients(topo, cal).with_evidence("measured", "p", ("quantize_b_s", "inter_host_b_s"))
    assert gate_precision(CostModel(topo, 512, ok), wanted) == (
        wanted,
        ["comm precision fp16/bf16: its cost and savings are measured"],
        False,
    )


def test_what_if_sixteen_bit_prints_both_verdicts():
    from sparselift.optimizer.table_stats import stats_from_spec
    from sparselift.workloads.spec import load_workload

    stats = stats_from_spec(load_workload("multihot-26").capped(100_000))
    topo = preset("h100x8", 16)
    res = optimize(Inputs(stats, topo, 512, coefficients(topo)), time_limit_s=5, mode="decomposed")
    (line,) = [n for n in res.notes if n.startswith("comm precision")]
    assert "SparseLift's model" in line and "TorchRec's estimator" in line
    chosen = line.split()[2]  # "comm precision <chosen> …"
    precision = res.plan.comm_precision
    assert chosen == ("fp32" if precision.forward == "fp32" else "fp16/bf16")
    assert (chosen == "fp32") == ("rather than" in line)


# --------------------------------------------------------------------- (e) secondary objective
def _measured_pipeline(gain_share: float):
    """Coefficients whose measured pipeline overlap saves `gain_share` of the base plan's step."""
    topo = preset("cpu-gloo", 2)
    # a measured, dear allreduce: data-parallel does not pay, so input_dist is there to hide
    allreduce = {"x": "bytes", "a_s": 1e-3, "b_s": 1e-6, "r2": 0.9, "n": 10}
    cal = {
        "device": "cpu",
        "ops": {"dp_allreduce": allreduce},
        "pipeline_overlap": 0.0,
        "provenance": {"profile": "p"},
    }
    k = _dear_input_dist(coefficients(topo, cal)).replace(pipeline_overhead_s=0.0)
    base = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5)
    assert base.plan.pipeline == "base"
    step, input_dist = base.cost.step_time_s, base.cost.phases_s["input_dist"]
    return topo, k.replace(pipeline_overlap=gain_share * step / input_dist)


def test_of_two_options_with_equal_step_the_non_risky_one_is_chosen():
    topo, k = _measured_pipeline(0.0)  # sparse-dist hides nothing: the same step
    res = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5)
    assert res.plan.pipeline == "base"


def test_a_near_tie_goes_to_the_non_risky_option_and_a_real_gain_to_the_risky_one():
    topo, k = _measured_pipeline(RISK_TOLERANCE / 50)  # a gain well inside the tolerance
    model = CostModel(topo, 1024, k)
    old = solve(
        Problem(TABLES, model, PlanWide(), feasible_classes(model, TABLES, PlanWide())),
        time_limit_s=5,
    )
    assert old.pipeline == "sparse-dist"  # the step alone takes the risk
    res = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5)
    assert res.plan.pipeline == "base"
    topo, k = _measured_pipeline(5 * RISK_TOLERANCE)  # a gain beyond the tolerance
    assert optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5).plan.pipeline == "sparse-dist"


# ------------------------------------------------------------------------------- (d) evidence
def test_every_plan_records_its_coefficients_evidence_and_plan_show_prints_it(tmp_path, capsys):
    topo = preset("cpu-gloo", 2)
    cal = {
        "device": "cpu",
        "ops": {
            "lookup_fwd": {"x": "work", "a_s": 1e-5, "b_s": 3e-9, "r2": 0.9, "n": 10},
            "input_dist": {"x": "bytes", "a_s": 1e-4, "b_s": 1e-9, "r2": 0.9, "n": 10},
        },
        "provenance": {"profile": "/profiles/tiny"},
    }
    k = coefficients(topo, cal)
    res = optimize(Inputs(TABLES, topo, 1024, k), time_limit_s=5)
    ev = res.plan.evidence
    assert list(ev) == list(COEFFICIENT_NAMES)
    assert ev["lookup_fwd"] == {"source": "measured", "from": "/profiles/tiny"}
    assert ev["input_dist"]["source"] == "measured"
    assert ev["pipeline_overlap"] == {"source": "assumed", "from": "preset cpu-gloo"}
    assert ev["uvm_miss_b_s"]["source"] == "assumed"
    path = tmp_path / "plan.json"
    plans.save(res.plan, path)
    back = plans.load(path)
    assert back.evidence == ev
    # plan show: measured first, then assumed, one line per coefficient
    assert main(["plan", "show", str(path)]) == 0
    out = capsys.readouterr().out
    # the measured intra-host per-byte cost raised the inter-host one (a lower bound of it)
    measured = ["lookup_fwd", "input_dist", "inter_host_b_s"]
    assert [n for n, e in ev.items() if e["source"] == "measured"] == measured
    lines = out[out.index(f"evidence (3 of {len(ev)}") :].splitlines()[1:]
    assert len(lines) == len(COEFFICIENT_NAMES)
    assert [ln.split()[0] for ln in lines[:3]] == sorted(measured)
    assert all(ln.split()[1] == "measured" for ln in lines[:3])
    assert all(ln.split()[1] == "assumed" for ln in lines[3:])
    assert "from /profiles/tiny" in lines[0] and "from preset cpu-gloo" in lines[-1]


def test_plans_without_evidence_still_load_and_bad_evidence_is_refused(tmp_path):
    topo = preset("cpu-gloo", 2)
    res = optimize(Inputs(TABLES, topo, 1024, coefficients(topo)), time_limit_s=5)
    d = res.plan.to_dict()
    assert all(e["source"] == "assumed" for e in d["evidence"].values())
    old = {k: v for k, v in d.items() if k != "evidence"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = plans.load(tmp_path / "old.json")
    assert loaded.evidence is None and "evidence" not in loaded.to_dict()
    bad = json.loads(json.dumps(d))
    bad["evidence"]["lookup_fwd"]["source"] = "guessed"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(plans.PlanError, match="evidence"):
        plans.load(tmp_path / "bad.json")


def test_the_fast_schema_check_accepts_plans_with_evidence():
    from sparselift.plans.schema import _fast_check

    topo = preset("cpu-gloo", 2)
    d = optimize(Inputs(TABLES, topo, 1024, coefficients(topo)), time_limit_s=5).plan.to_dict()
    assert _fast_check()(d)
    d["evidence"]["lookup_fwd"] = {"source": "measured"}  # no "from"
    assert not _fast_check()(d)


def test_row_wise_is_risky_until_a_profile_ran_it():
    """A calibration from table-wise profiles prices row-wise's reduce-scatter (an all-reduce on
    gloo) only by analogy with the all-to-all: risky until a profile ran row-wise."""
    from sparselift.analysis.pipeline import analyze
    from sparselift.optimizer.robust import risky_class
    from sparselift.optimizer.space import RW, TW

    fixtures = Path(__file__).parent / "fixtures"
    topo = preset("cpu-gloo", 2)
    rw, tw = OptionClass(RW, FUSED, 2), OptionClass(TW, FUSED, 1)
    for fixture, ran, rw_risky in (("table_wise", TW, True), ("row_wise", RW, False)):
        cal = analyze(fixtures / f"profile_tiny_{fixture}", cache=False).calibration
        coeffs = coefficients(topo, cal)
        assert coeffs.profiled_types == (ran,)
        assert risky_class(rw, coeffs) == rw_risky
        assert not risky_class(tw, coeffs)
    assert not risky_class(rw, coefficients(topo))  # nothing profiled: no such rule


def test_data_parallel_is_risky_until_profiles_measured_the_dense_kernel():
    """Without a profile of data-parallel tables, their backward (FBGEMM's dense TBE) is priced
    by analogy with the fused kernels', and without one beside a plan that replicates other
    tables, the trainer's optimizer pass over them is the preset's: risky until both ran."""
    from sparselift.analysis.joint import fit_jointly
    from sparselift.analysis.pipeline import analyze
    from sparselift.optimizer.robust import risky_class
    from sparselift.optimizer.space import DP, TW

    fixtures = Path(__file__).parent / "fixtures"
    topo = preset("cpu-gloo", 2)
    dp, tw = OptionClass(DP, "dense", 2), OptionClass(TW, FUSED, 1)
    for names, dp_risky in (
        (["table_wise"], True),
        (["data_parallel"], True),
        (["data_parallel", "table_wise_same_job", "table_wise_same_job_2"], False),
    ):
        analyses = [analyze(fixtures / f"profile_tiny_{n}", cache=False) for n in names]
        coeffs = coefficients(topo, fit_jointly(analyses, cache=False).calibration)
        assert coeffs.measured("dp_allreduce")  # the dense model's all-reduce, in every one
        assert risky_class(dp, coeffs) == dp_risky
        assert not risky_class(tw, coeffs)
    assert not risky_class(dp, coefficients(topo))  # nothing profiled: no such rule
