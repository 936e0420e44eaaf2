"""The optimizer's splits: offered from measured hot ids, chosen exactly when the cost model says
they pay (checked against solving every way of running the table on its own), written as plan
format 2, and refused where the evidence does not fit (stale hot ids, a profile of a split model).

Real solver, real cost model, real plan loader; the constructed tables make a split pay or not.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from plans_helpers import train_as_planned
from split_helpers import BATCH, split_coeffs, split_hot_ids, split_tables

from sparselift import plans
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import MEASURED, Linear, coefficients, from_topology
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.feasibility import feasible_classes, part_classes
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.problem import Problem
from sparselift.optimizer.profile_input import read_profile
from sparselift.optimizer.robust import RISK_TOLERANCE, margin_for_splits
from sparselift.optimizer.solver import solve
from sparselift.optimizer.space import DP, TW, PlanWide
from sparselift.optimizer.split_options import (
    HOT_COVERAGES,
    hot_cold_from_zipf,
    row_range_options,
    split_options,
)
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset
from sparselift.profiler.hot_ids import HotIds

FIXTURES = Path(__file__).parent / "fixtures"


def _best_per_way(stats, opts, model) -> dict[tuple[str, ...], float]:
    """The optimal step of every way of running the split table, each solved on its own."""
    wide = PlanWide()
    classes = {**feasible_classes(model, stats, wide), **part_classes(model, opts, wide)}
    ((table, options),) = opts.items()
    out = {}
    for way in [(table,), *(o.part_names for o in options)]:
        if way == (table,):
            tables, cs = stats, classes
        else:
            parts = next(o.parts for o in options if o.part_names == way)
            tables = [q for s in stats for q in (parts if s.name == table else (s,))]
            cs = {s.name: classes[s.name] for s in tables}
        p = Problem(tables, model, wide, cs, allow_sparse_dist=False)
        sol = solve(p, time_limit_s=10, mode="exact")
        out[way] = model.evaluate(p.by_name, sol.choices, wide).step_time_s
    return out


@pytest.mark.parametrize(
    "transform_b_s, recombine_b_s, pays",
    [(1e-12, 1e-12, True), (1e-6, 1e-12, False), (1e-12, 1e-6, False)],
    ids=["cheap", "dear-transform", "dear-recombine"],
)
def test_a_split_is_chosen_exactly_when_the_model_says_it_pays(transform_b_s, recombine_b_s, pays):
    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    model = CostModel(topo, BATCH, split_coeffs(topo, transform_b_s, recombine_b_s))
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    opts = {k: v for k, v in split_options(stats, 2, hot).items() if k == "heavy"}
    assert [o.kind for o in opts["heavy"]].count("hot_cold") >= 2  # several hot sizes offered
    best = _best_per_way(stats, opts, model)
    cheapest = min(best, key=best.__getitem__)
    # both ways are exercised: a split pays when the split model's costs are nearly free, not
    # at 1 µs per id routed or per pooled element recombined
    assert (cheapest != ("heavy",)) == pays

    inp = Inputs(stats, topo, BATCH, model.coeffs, splits=opts)
    res = optimize(inp, time_limit_s=20, min_gain=0.0)
    chosen = [(s.parts, s.hot_ids, s.ranges) for s in res.plan.splits]
    want = [(o.plan_names, o.hot_ids, o.ranges) for o in opts["heavy"] if o.part_names == cheapest]
    assert chosen == want
    assert res.cost.step_time_s == pytest.approx(best[cheapest], rel=1e-6)


def test_a_split_is_taken_only_past_the_calibrations_held_out_error():
    # a rewrite no profile ran: predicted faster by less than the model is measured to miss a
    # plan it was not fitted on, the plan without splits stands; by more, the split is taken
    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    coeffs = split_coeffs(topo, 1e-12)
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    opts = {k: v for k, v in split_options(stats, 2, hot).items() if k == "heavy"}
    best = _best_per_way(stats, opts, CostModel(topo, BATCH, coeffs))
    gain = best[("heavy",)] / min(best.values())
    assert gain > 1.01  # the case: a split the model says pays
    for error, split in ((gain - 1 + 0.005, False), (gain - 1 - 0.005, True)):
        inp = Inputs(stats, topo, BATCH, coeffs.replace(held_out_error=error), splits=opts)
        res = optimize(inp, time_limit_s=20, min_gain=0.0)
        assert bool(res.plan.splits) == split
        assert any(n.startswith("no splits: the best plan with splits") for n in res.notes) != split
        want = min(best.values()) if split else best[("heavy",)]
        assert res.cost.step_time_s == pytest.approx(want, rel=1e-6)
    # a margin the caller sets (tune: a measurement decides before anything ships) stands in
    # for the leave-one-out error: the split the error turned down is taken
    measured = coeffs.replace(held_out_error=gain - 1 + 0.005)
    res = optimize(
        Inputs(stats, topo, BATCH, measured, splits=opts),
        time_limit_s=20,
        min_gain=0.0,
        split_margin=gain - 1 - 0.005,
    )
    assert res.plan.splits and res.cost.step_time_s == pytest.approx(min(best.values()), rel=1e-6)
    assert margin_for_splits(measured, 0.1, 0.02) == (0.02, "--split-margin")
    # no leave-one-out error measured: --min-gain is the margin
    assert margin_for_splits(coeffs, 0.1) == (0.1, "--min-gain: no leave-one-out error measured")


def test_a_profiled_split_plan_is_kept_only_while_its_splits_pay():
    # The profiled plan splits "heavy". Nothing beats it by min_gain, so it is kept as it is
    # while the model prices its split as paying; once the split model's costs are measured
    # dear (as a split plan's steps measure them), the best plan without splits stands in.
    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    opts = {k: v for k, v in split_options(stats, 2, hot).items() if k == "heavy"}
    cheap, dear = split_coeffs(topo, 1e-12), split_coeffs(topo, 1e-6)
    profiled = optimize(Inputs(stats, topo, BATCH, cheap, splits=opts), time_limit_s=20).plan
    assert profiled.splits
    without = _best_per_way(stats, opts, CostModel(topo, BATCH, dear))[("heavy",)]
    for coeffs, pays in ((cheap, True), (dear, False)):
        inp = Inputs(stats, topo, BATCH, coeffs, splits=opts)
        res = optimize(inp, time_limit_s=20, min_gain=10.0, current=profiled)
        assert res.kept_baseline and bool(res.plan.splits) == pays
        stood_in = any("stands in for it" in n for n in res.notes)
        assert stood_in != pays
        if pays:
            assert res.plan.tables == profiled.tables and res.plan.splits == profiled.splits
            assert res.plan.solver["status"].endswith(" (profiled plan kept)")
        else:
            assert res.cost.step_time_s == pytest.approx(without, rel=1e-6)
            assert any(n.startswith("kept the profiled plan without its splits") for n in res.notes)
            assert res.plan.solver["status"].endswith(" (profiled plan without its splits kept)")


def test_a_kept_split_plan_is_priced_by_the_measured_hot_ids_as_predict_plan_prices_it():
    # The hot ids measure a hot share (0.8) far from the table's skew curve, so a plan's
    # hot/cold split priced without them costs otherwise: the kept plan's cost, the profiled
    # plan's and `predict_plan`'s (what `plan check` compares with the re-planned step) agree.
    from sparselift.optimizer.predict import predict_plan

    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    opts = {k: v for k, v in split_options(stats, 2, hot).items() if k == "heavy"}
    coeffs = split_coeffs(topo, 1e-12)
    profiled = optimize(Inputs(stats, topo, BATCH, coeffs, splits=opts), time_limit_s=20).plan
    assert profiled.splits
    share = stats[0].hot_share(len(profiled.splits[0].hot_ids) / stats[0].num_embeddings)
    assert abs(share - 0.8) > 0.05  # the curve and the measured ids disagree
    want = predict_plan(profiled, stats, coeffs, topo, BATCH, hot).step_time_s
    for current, baseline in ((profiled, None), (None, profiled)):
        inp = Inputs(stats, topo, BATCH, coeffs, splits=opts, hot=hot)
        res = optimize(inp, time_limit_s=20, min_gain=10.0, current=current, baseline=baseline)
        assert res.kept_baseline and res.plan.splits == profiled.splits
        assert res.cost.step_time_s == pytest.approx(want, rel=1e-9)


def test_the_held_out_error_is_the_calibrations_largest_leave_one_out_miss():
    topo = preset("cpu-gloo", 2)
    cal: dict = {"device": "cpu", "ops": {"input_dist": {"x": "bytes", "a_s": 1e-4, "b_s": 1e-9}}}
    assert coefficients(topo, cal).held_out_error is None  # one profile: not measured
    runs = [("a", 0.100, 0.104), ("b", 0.200, 0.188), ("c", 1.0, 1.0)]
    cal["held_out"] = [
        {"profile": p, "measured_step_s": m, "predicted_step_s": q} for p, m, q in runs
    ]
    assert coefficients(topo, cal).held_out_error == pytest.approx(0.06)
    assert coefficients(topo, cal).held_out_by == "b"
    # the note names the profile, and what no other profile ran where its error measures that
    cal["held_out"][1]["unmeasured"] = ["data_parallel tables"]
    margin, why = margin_for_splits(coefficients(topo, cal), 0.1)
    assert margin == pytest.approx(0.06)
    assert why.endswith("error, of b, where no other profile ran its data_parallel tables")


def test_the_optimizers_split_plan_is_a_valid_format_2_plan_and_repeats_byte_for_byte():
    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    coeffs = split_coeffs(topo, 1e-12)
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    docs = []
    for _ in range(2):
        inp = Inputs(stats, topo, BATCH, coeffs, splits=split_options(stats, 2, hot))
        plan = optimize(inp, time_limit_s=20, min_gain=0.0).plan
        docs.append(json.dumps(plan.to_dict(), sort_keys=True))
    assert docs[0] == docs[1]
    plan = plans.Plan.from_dict(json.loads(docs[0]), "test")
    (split,) = [s for s in plan.splits if s.table == "heavy"]
    assert split.kind == "hot_cold" and split.parts == ("heavy__hot", "heavy__cold")
    assert list(split.hot_ids) == hot["heavy"].ids[: len(split.hot_ids)].tolist()
    by_name = {t.name: t for t in plan.tables}
    assert "heavy" not in by_name and by_name["heavy__hot"].sharding_type == DP
    assert [t.name for t in plan.model] == [s.name for s in stats]  # the model is unchanged
    assert {t.name for t in plan.sharded_tables()} == set(by_name)


def test_parts_only_take_the_sharding_types_their_split_allows():
    topo = preset("cpu-gloo", 4)
    stats = split_tables()
    model = CostModel(topo, BATCH, split_coeffs(topo, 1e-12))
    opts = split_options(stats, 4, {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)})
    classes = part_classes(model, opts, PlanWide())
    for o in opts["heavy"]:
        for part, allowed in zip(o.parts, o.sharding_types, strict=True):
            types = {c.sharding_type for c in classes[part.name]}
            assert types and (not allowed or types <= set(allowed))
    kinds = {o.kind for o in opts["heavy"]}
    assert kinds == {"hot_cold", "row_ranges", "column_slices"}
    assert all(
        ts == (TW,) for o in opts["heavy"] if o.kind != "hot_cold" for ts in o.sharding_types
    )


def test_stale_hot_ids_are_refused_naming_the_table():
    stats = split_tables()
    hot = {"heavy": split_hot_ids("heavy", 150_000, 1_000, 0.5)}  # recorded at another size
    with pytest.raises(UserError, match=r"table 'heavy'.*150,000 rows.*200,000"):
        split_options(stats, 2, hot)


def test_row_ranges_count_the_hot_ids_in_each_range_and_spread_the_rest():
    t = TableStats("t", 100_000, 64, 10.0, feature_names=("f",))
    ids = np.array([10, 20, 60_000], dtype=np.int64)  # two hot ids in the first half
    counts = np.array([500, 300, 100], dtype=np.int64)
    hot = HotIds("t", ids, counts, 1_000, 5_000, 100_000, capped=False)
    (two,) = [o for o in row_range_options(t, 2, hot) if len(o.parts) == 2]
    assert two.ranges == ((0, 50_000), (50_000, 100_000))
    # 100 lookups off the hot ids, spread over the 99,997 other rows: 49,998 in the first half
    first = (800 + 100 * 49_998 / 99_997) / 1_000
    shares = [q.ids_per_sample / t.ids_per_sample for q in two.parts]
    assert shares == pytest.approx([first, 1.0 - first])


def test_zipf_hot_sizes_reach_their_coverage_and_grow_with_it():
    t = TableStats("t", 1_000_000, 64, 20.0, zipf_alpha=1.1, feature_names=("f",))
    opts = hot_cold_from_zipf(t, list(range(65_536)))
    shares = [o.hot_share for o in opts]
    sizes = [len(o.hot_ids) for o in opts]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    assert all(s >= c - 1e-9 for s, c in zip(shares, HOT_COVERAGES, strict=False))
    assert opts[0].parts[0].ids_per_sample == pytest.approx(20.0 * shares[0])


def test_a_profile_of_a_split_model_is_refused(tmp_path):
    prof = tmp_path / "prof"
    shutil.copytree(FIXTURES / "profile_tiny_table_wise", prof)
    m = json.loads((prof / "manifest.json").read_text())
    t = m["tables"][0]
    t["feature_names"] = [f"{f}/{t['name']}" for f in t.get("feature_names") or [t["name"]]]
    (prof / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match=rf"splits tables .*{t['name']}"):
        read_profile(prof, need_calibration=False)


@pytest.mark.parametrize("seed", range(4))
def test_on_random_workloads_splits_on_offer_never_price_a_plan_higher(seed):
    """Unsplit is one way among those offered: the solve with splits may only lower the step."""
    from sparselift.optimizer.synthetic import synthetic_stats

    world = 2 + 2 * (seed % 2)
    topo = preset("cpu-gloo", world)
    stats = synthetic_stats(6 + seed, seed=seed, max_rows=300_000)
    coeffs = from_topology(topo, dense_step_s=0.01)  # the transform assumed: priced at a margin
    hottest = {s.name: range(min(s.num_embeddings, 65_536)) for s in stats}
    offered = split_options(stats, world, hottest=hottest)
    assert offered
    steps = []
    for splits in ({}, offered):
        inp = Inputs(stats, topo, BATCH, coeffs, splits=splits)
        res = optimize(inp, time_limit_s=60, mode="exact")
        assert res.solution.status == "OPTIMAL"  # the claim is about the model's optimum
        assert [t.name for t in res.plan.model] == [s.name for s in stats]
        steps.append(res.cost.step_time_s)
    # risky parts (assumed costs) cost the secondary objective at most RISK_TOLERANCE
    assert steps[1] <= steps[0] * (1 + RISK_TOLERANCE)
    # the split model's costs measured and nearly free: splits pay on these shapes, and are taken
    # where the model is measured to miss by nothing; measured to miss by more than any split
    # gains, none is, and the plan is the one without splits on offer
    cheap = split_coeffs(topo, 1e-12)
    plain = optimize(Inputs(stats, topo, BATCH, cheap), time_limit_s=60, mode="exact")
    for error in (0.0, 1.0):
        inp = Inputs(stats, topo, BATCH, cheap.replace(held_out_error=error), splits=offered)
        res = optimize(inp, time_limit_s=60, mode="exact")
        assert bool(res.plan.splits) == (error == 0.0)
        if error:
            assert res.cost.step_time_s == pytest.approx(plain.cost.step_time_s, rel=1e-6)
        else:
            split_plan = res.plan
    # that split plan profiled, and nothing gains min_gain over it: kept while its splits pay;
    # with the split model's costs measured dear, the best plan without splits stands in
    dear = split_coeffs(topo, 1e-6, 1e-6)
    plain_dear = optimize(Inputs(stats, topo, BATCH, dear), time_limit_s=60, mode="exact")
    for coeffs, pays in ((cheap, True), (dear, False)):
        inp = Inputs(stats, topo, BATCH, coeffs, splits=offered)
        res = optimize(inp, time_limit_s=60, mode="exact", min_gain=10.0, current=split_plan)
        assert res.kept_baseline and bool(res.plan.splits) == pays
        if pays:
            assert res.plan.splits == split_plan.splits
        else:
            assert res.cost.step_time_s == pytest.approx(plain_dear.cost.step_time_s, rel=1e-6)


def test_a_split_plan_is_priced_again_as_it_was_planned_and_seeds_a_new_solve():
    from sparselift.optimizer.predict import predict_plan

    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    coeffs = split_coeffs(topo, 1e-12)
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    inp = Inputs(stats, topo, BATCH, coeffs, splits=split_options(stats, 2, hot))
    res = optimize(inp, time_limit_s=20, min_gain=0.0)
    assert res.plan.splits
    again = predict_plan(res.plan, stats, coeffs, topo, BATCH, hot)
    assert again.step_time_s == pytest.approx(res.cost.step_time_s, rel=1e-9)
    # the split plan as the plan to beat (plan check re-plans so): it is kept or beaten
    rerun = optimize(inp, time_limit_s=20, baseline=res.plan, min_gain=0.0)
    assert rerun.cost.step_time_s <= res.cost.step_time_s * (1 + 1e-9)


def test_parts_are_risky_choices_until_the_split_models_costs_are_measured():
    from sparselift.optimizer.robust import robust_problem

    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    opts = split_options(stats, 2, {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)})
    # measured: the split model's costs, and the data-parallel all-reduce, dense backward and
    # optimizer pass (a hot part's class)
    dp_costs = ("dp_allreduce", "dense_bwd_scale", "dense_grad_b_s")
    measured = split_coeffs(topo, 1e-9).with_evidence(MEASURED, "test", dp_costs)
    for coeffs, risky in ((from_topology(topo, 0.01), True), (measured, False)):
        model = CostModel(topo, BATCH, coeffs)
        classes = {
            **feasible_classes(model, stats, PlanWide()),
            **part_classes(model, opts, PlanWide()),
        }
        p = robust_problem(stats, model, PlanWide(), classes, opts)
        flagged = {name for name, _ in p.risky}
        assert all((q.name in flagged) == risky for o in opts["heavy"] for q in o.parts)
        assert not flagged & {s.name for s in stats}  # the model's own tables are not
        assert (p.risk_penalty_ns > 0) == risky


@pytest.mark.slow
def test_the_optimizers_split_plan_from_a_real_profile_trains(tmp_path):
    """Profile tiny, plan with its measured hot ids, and train that plan on 2 gloo ranks as it
    says. So that a split pays whatever this host measured, the split model's own costs are
    made free and moving ids dear (what the test checks is that the split plan runs)."""
    from sparselift.cli import main
    from sparselift.optimizer.coefficients import coefficients
    from sparselift.optimizer.topology import profiled_topology

    prof = tmp_path / "prof"
    profile = ["profile", "--workload", "tiny", "--nproc", "2", "--steps", "3", "--warmup", "2"]
    assert main([*profile, "--out", str(prof)]) == 0
    assert main(["analyze", str(prof)]) == 0
    pin = read_profile(prof, need_calibration=True)
    assert pin.hot_ids  # the profile recorded them
    topo = profiled_topology(pin.calibration, str(prof))
    measured = coefficients(topo, pin.calibration)
    free = measured.replace(
        batch_transform=Linear(0.0, 0.0),
        recombine_b_s=0.0,
        input_dist=Linear(measured.input_dist.a_s, 1e-6),  # a second per MB of ids
    )
    free = free.with_evidence(MEASURED, "test", ("batch_transform", "recombine_b_s"))
    inp = Inputs(
        pin.stats, topo, pin.batch_size, free, splits=split_options(pin.stats, 2, pin.hot_ids)
    )
    plan = optimize(inp, time_limit_s=20, min_gain=0.0).plan
    assert plan.splits
    path = tmp_path / "split.json"
    plans.save(plan, path)
    train_as_planned(path)  # every virtual table trained as the plan says


def test_what_if_16_bit_is_not_taken_for_a_split_plan_torchrec_cannot_rate():
    """Unprofiled hardware and 16 bits that the model says pay: TorchRec's estimator must agree,
    and it cannot price virtual tables, so a plan with splits keeps fp32."""
    topo = preset("cpu-gloo", 2)
    stats = split_tables()
    cheap = split_coeffs(topo, 1e-12).replace(quantize_b_s=0.0)  # 16 bits priced as free
    cheap = dataclasses.replace(cheap, evidence=from_topology(topo).evidence)  # all assumed
    hot = {"heavy": split_hot_ids("heavy", 200_000, 4_000, 0.8)}
    inp = Inputs(stats, topo, BATCH, cheap, splits=split_options(stats, 2, hot))
    res = optimize(inp, time_limit_s=20, min_gain=0.0, two_models=False)
    assert any("comm precision" in n and "TorchRec's estimator" in n for n in res.notes)
    assert res.plan.splits  # the split pays by the model here
    precision = res.plan.comm_precision
    assert (precision.forward, precision.backward) == ("fp32", "fp32")
