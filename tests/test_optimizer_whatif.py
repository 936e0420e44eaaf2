"""What-if planning (CUDA, nothing measured): TorchRec's per-shard prices are its estimator's,
the two-model objective is SparseLift's step plus TorchRec's verdict, the plan is never rated worse
than TorchRec's by TorchRec's own estimator, and where the two models disagree on an option the
plan takes the choice both accept, printing both verdicts.

Real TorchRec throughout (its planner, EmbeddingPerfEstimator and storage estimator).
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from sparselift import plans
from sparselift.optimizer.agreement import both_accept
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.costs import DDR_COL, HBM_COL
from sparselift.optimizer.descent import descend
from sparselift.optimizer.feasibility import feasible_classes
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.placement import place_greedy
from sparselift.optimizer.planio import choices_from_plan, to_plan
from sparselift.optimizer.robust import robust_problem, without_uvm
from sparselift.optimizer.solver import solve
from sparselift.optimizer.space import DP, Choice, PlanWide, enumerate_classes
from sparselift.optimizer.synthetic import synthetic_stats, whatif_corpus
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset
from sparselift.optimizer.torchrec_baseline import torchrec_best_plan
from sparselift.optimizer.torchrec_prices import TorchRecPrices
from sparselift.optimizer.torchrec_referee import storage_verdicts, torchrec_cost
from sparselift.optimizer.whatif import PriceBook, TwoModelCost, exchange_rate, two_model_mode

HALF = plans.CommPrecision(forward="fp16", backward="bf16")


def _random_choices(stats, topo, batch, rng) -> dict[str, Choice]:
    out = {}
    for s in stats:
        c = rng.choice(enumerate_classes(s, topo, batch))
        if c.located == "rank":
            out[s.name] = Choice(
                c, ranks=tuple(sorted(rng.sample(range(topo.world_size), c.shards)))
            )
        elif c.located == "host":
            out[s.name] = Choice(c, host=rng.randrange(topo.num_hosts))
        else:
            out[s.name] = Choice(c)
    return out


@pytest.mark.parametrize("world,precision", [(8, plans.CommPrecision()), (16, HALF)])
def test_prices_are_torchrecs_estimate_of_the_plan_file(world, precision):
    # every class (UVM caching at both load factors too), placed at random: the verdict from the
    # per-shard prices is TorchRec's estimator run on the plan file
    topo, batch = preset("h100x8", world), 1024
    stats = synthetic_stats(10, seed=world, max_rows=40_000_000)
    # two of them an EmbeddingCollection's (TorchRec estimates its unpooled outputs)
    stats[1:3] = [dataclasses.replace(s, sequence=True) for s in stats[1:3]]
    rng = random.Random(world)
    prices = TorchRecPrices(stats, topo, batch, precision)
    wide = PlanWide(precision.forward, precision.backward)
    drawn = [_random_choices(stats, topo, batch, rng) for _ in range(4)]
    rated = torchrec_cost([to_plan(stats, ch, topo, wide) for ch in drawn], stats, topo, batch)
    for ch, v in zip(drawn, rated, strict=True):
        assert prices.rate_s(ch) * 1e3 == pytest.approx(v.rate_ms, rel=1e-9)


def test_the_two_model_objective_is_sparselifts_step_plus_weighted_torchrec_verdict():
    # data-parallel tables included: their allreduce shares the phase TorchRec's estimate rides in
    topo, batch = preset("h100x8", 16), 512
    stats = synthetic_stats(12, seed=3, max_rows=4_000_000)
    own = CostModel(topo, batch, coefficients(topo))
    book = PriceBook(stats, topo, batch)
    two = TwoModelCost(own, book, 0.7)
    by_name = {s.name: s for s in stats}
    rng = random.Random(3)
    wide = PlanWide("fp16", "bf16")
    for _ in range(5):
        ch = _random_choices(stats, topo, batch, rng)
        ch["t0"] = Choice(
            next(c for c in enumerate_classes(stats[0], topo, batch) if c.sharding_type == DP)
        )
        got = two.evaluate(by_name, ch, wide).step_time_s
        want = own.evaluate(by_name, ch, wide).step_time_s + 0.7 * book.at(wide).rate_s(ch)
        assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_what_if_plans_are_never_worse_than_torchrecs_by_its_own_estimator(seed):
    w = whatif_corpus(seed + 1, 20, 30)[seed]
    topo = preset("h100x8", 8)
    base = torchrec_best_plan(w.stats, topo, w.batch_size, 5)
    res = optimize(
        Inputs(w.stats, topo, w.batch_size, coefficients(topo)), time_limit_s=3, baseline=base
    )
    same = dataclasses.replace(base, comm_precision=res.plan.comm_precision)
    ours, theirs = torchrec_cost([res.plan, same], w.stats, topo, w.batch_size)
    assert ours.rate_ms <= theirs.rate_ms * (1 + 1e-9)
    assert res.verdicts is not None and res.verdicts.accepted  # SparseLift's model agrees
    assert res.verdicts.ours_torchrec_s * 1e3 == pytest.approx(ours.rate_ms, rel=1e-9)
    assert storage_verdicts([res.plan], w.stats, topo, w.batch_size)[0].fits
    lines = [n for n in res.notes if "vs TorchRec's plan" in n]
    assert lines and "SparseLift's model" in lines[-1] and "TorchRec's estimator" in lines[-1]


@pytest.mark.parametrize("seed", [4, 5])
def test_what_if_plans_with_sequence_tables_hold_under_torchrecs_estimator(seed):
    # a third of the tables an EmbeddingCollection's, on two hosts: no table-row-wise for them
    w = whatif_corpus(seed + 1, 20, 30)[seed]
    stats = [dataclasses.replace(s, sequence=i % 3 == 0) for i, s in enumerate(w.stats)]
    topo = preset("h100x8", 16)
    base = torchrec_best_plan(stats, topo, w.batch_size, 5)
    res = optimize(
        Inputs(stats, topo, w.batch_size, coefficients(topo)), time_limit_s=3, baseline=base
    )
    assert {t.name for t in res.plan.model if t.sequence} == {s.name for s in stats if s.sequence}
    seq = {s.name for s in stats if s.sequence}
    assert all(t.sharding_type != "table_row_wise" for t in res.plan.tables if t.name in seq)
    assert all(t.sharding_type != "table_row_wise" for t in base.tables if t.name in seq)
    plans.Plan.from_dict(res.plan.to_dict())  # a plan the loader accepts
    same = dataclasses.replace(base, comm_precision=res.plan.comm_precision)
    ours, theirs = torchrec_cost([res.plan, same], stats, topo, w.batch_size)
    assert ours.rate_ms <= theirs.rate_ms * (1 + 1e-9)
    assert storage_verdicts([res.plan], stats, topo, w.batch_size)[0].fits


def _free_data_parallel(topo):
    """Preset coefficients (all assumed) that price data-parallel as nearly free: its allreduce
    hidden behind backward, no whole-table optimizer pass. TorchRec's estimator still charges the
    allreduce of the whole table."""
    return coefficients(topo).replace(dp_overlap=1.0, dense_grad_b_s=0.0)


def _medium_and_small() -> list[TableStats]:
    """Six medium tables (replicating one costs TorchRec's estimator an allreduce of 0.5 GB),
    six small ones."""
    medium = [
        TableStats(f"m{i}", 2_000_000, 64, 8.0 + 2 * i, zipf_alpha=1.1, feature_names=(f"m{i}",))
        for i in range(6)
    ]
    small = [
        TableStats(f"s{i}", 20_000 * (i + 1), 32 * (1 + i % 3), 3.0 + i, feature_names=(f"s{i}",))
        for i in range(6)
    ]
    return medium + small


def test_where_the_models_disagree_the_plan_takes_the_choice_both_accept():
    topo, batch = preset("h100x8", 16), 2048
    stats = _medium_and_small()
    k = _free_data_parallel(topo)
    assert two_model_mode(topo, k)
    base = torchrec_best_plan(stats, topo, batch, 5)
    base_ch, _ = choices_from_plan(base, topo)
    own = CostModel(topo, batch, k)
    by_name = {s.name: s for s in stats}
    # SparseLift's model alone: data-parallel for the large tables, which TorchRec rates dear
    feasible = feasible_classes(own, stats, PlanWide())
    classes = without_uvm(feasible) or feasible
    alone = solve(robust_problem(stats, own, PlanWide(), classes), time_limit_s=3).choices
    book = PriceBook(stats, topo, batch)
    prices = book.at(PlanWide())
    assert sum(ch.cls.sharding_type == DP for ch in alone.values()) >= len(stats) // 2
    assert prices.rate_s(alone) > prices.rate_s(base_ch)  # TorchRec's estimator: worse
    res = optimize(Inputs(stats, topo, batch, k), time_limit_s=5, baseline=base)
    got, _ = choices_from_plan(res.plan, topo)
    wide = PlanWide(res.plan.comm_precision.forward, res.plan.comm_precision.backward)
    same = dataclasses.replace(base, comm_precision=res.plan.comm_precision)
    ours, theirs = torchrec_cost([res.plan, same], stats, topo, batch)
    assert ours.rate_ms <= theirs.rate_ms * (1 + 1e-9)  # TorchRec accepts it …
    sl_base = min(own.evaluate(by_name, base_ch, w).step_time_s for w in (wide, PlanWide()))
    assert own.evaluate(by_name, got, wide).step_time_s <= sl_base * (1 + 1e-9)  # … and ours
    assert sum(ch.cls.sharding_type == DP for ch in got.values()) < sum(
        ch.cls.sharding_type == DP for ch in alone.values()
    )
    line = next(n for n in res.notes if n.startswith(("the plan vs", "TorchRec's plan kept")))
    assert "SparseLift's model" in line and "TorchRec's estimator" in line


def test_a_disputed_table_is_set_back_to_torchrecs_choice_and_the_rest_kept():
    topo, batch = preset("h100x8", 16), 2048
    stats = _medium_and_small()
    k = _free_data_parallel(topo)
    base = torchrec_best_plan(stats, topo, batch, 5)
    base_ch, base_wide = choices_from_plan(base, topo)
    res = optimize(Inputs(stats, topo, batch, k), time_limit_s=5, baseline=base)
    good, _ = choices_from_plan(res.plan, topo)
    assert not res.kept_baseline and good != base_ch
    wide = PlanWide(res.plan.comm_precision.forward, res.plan.comm_precision.backward)
    own = CostModel(topo, batch, k)
    book = PriceBook(stats, topo, batch)
    # one option the models disagree on: a medium table replicated (free to SparseLift's model
    # here, an allreduce of the whole table to TorchRec's estimator)
    big = stats[0]
    dp = next(c for c in enumerate_classes(big, topo, batch) if c.sharding_type == DP)
    disputed = {**good, big.name: Choice(dp)}
    both = both_accept(own, book, stats, disputed, base_ch, wide, base_wide)
    assert not both.solved.accepted and both.solved.rejected_by == "torchrec"
    assert both.verdicts.accepted and not both.kept
    assert both.choices[big.name] == base_ch[big.name]  # the disputed option: TorchRec's
    assert any(both.choices[n] == good[n] != base_ch[n] for n in good)  # the rest: ours
    assert any("set back" in n for n in both.notes)
    assert "SparseLift's model" in both.notes[0] and "TorchRec's estimator" in both.notes[0]


def test_the_descent_never_raises_the_objective_and_keeps_memory():
    topo, batch = preset("h100x8", 16), 1024
    stats = synthetic_stats(20, seed=7, max_rows=40_000_000)
    own = CostModel(topo, batch, coefficients(topo))
    feasible = feasible_classes(own, stats, PlanWide())
    classes = without_uvm(feasible) or feasible
    book = PriceBook(stats, topo, batch)
    two = TwoModelCost(
        own, book, exchange_rate(own, book.at(PlanWide()), stats, classes, PlanWide())
    )
    p = robust_problem(stats, two, PlanWide(), classes)
    start = place_greedy(p, {s.name: classes[s.name][0] for s in stats})  # table-wise, packed
    out = descend(p, start)
    before = two.evaluate(p.by_name, start).step_time_s
    after = two.evaluate(p.by_name, out).step_time_s
    assert after < before
    loads = p.rank_loads(out)
    assert all(r[HBM_COL] <= p.hbm_cap and r[DDR_COL] <= p.ddr_cap for r in loads)
    assert descend(p, out) == out or two.evaluate(p.by_name, descend(p, out)).step_time_s <= after


def test_measured_coefficients_keep_sparselifts_model_alone():
    topo = preset("h100x8", 16)
    cal = {"device": "cuda", "ops": {}, "dense_step_s": 0.01, "provenance": {"profile": "p"}}
    measured = coefficients(topo, cal)
    assert not two_model_mode(topo, measured)
    assert not two_model_mode(preset("cpu-gloo", 2), coefficients(preset("cpu-gloo", 2)))
    stats = synthetic_stats(8, seed=1)
    base = torchrec_best_plan(stats, topo, 512, 5)
    res = optimize(Inputs(stats, topo, 512, measured), time_limit_s=3, baseline=base)
    assert res.verdicts is None and "objective_of" not in (res.plan.solver or {})
    assert not any("TorchRec's estimator" in n for n in res.notes)


def test_what_if_plans_repeat_byte_for_byte():
    # small enough that CP-SAT proves the optimum: no wall clock on a loaded machine decides
    topo = preset("h100x8", 8)
    stats = synthetic_stats(5, seed=2, max_rows=20_000_000)
    base = torchrec_best_plan(stats, topo, 1024, 5)
    inp = Inputs(stats, topo, 1024, coefficients(topo))
    a, b = (optimize(inp, time_limit_s=10, baseline=base) for _ in range(2))
    assert a.plan.solver["status"] == "OPTIMAL"
    assert json.dumps(a.plan.to_dict(), sort_keys=True) == json.dumps(
        b.plan.to_dict(), sort_keys=True
    )
    assert a.notes == b.notes


def test_optimize_prints_both_verdicts_against_torchrecs_plan(cli, tmp_path):
    out = tmp_path / "p.json"
    code, printed, err = cli(
        "optimize", "--workload", "tiny", "--device", "h100x8", "--world-size", "16",
        "--time-limit", "3", "--out", out,
    )  # fmt: skip
    assert code == 0, err
    line = next(ln for ln in printed.splitlines() if "vs TorchRec's plan:" in ln)
    assert "SparseLift's model" in line and "TorchRec's estimator" in line
    assert plans.load(out).solver["objective_of"].startswith("SparseLift's step")
