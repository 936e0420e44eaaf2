"""`sparselift tune` on real 2-rank gloo training: the loop, the A/B verdict, and failures."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sparselift.analysis.compare import ab_interval, ratio_interval, steady_steps
from sparselift.cli import main
from sparselift.tune import models_step_s, tune
from sparselift.tune_ab import fastest_beside_baseline
from sparselift.tune_report import iteration_table, write_tune_report
from sparselift.workloads.harness import TrainConfig
from sparselift.workloads.launch import RankFailed

# min_gain 0: try any plan predicted faster than round-robin (the loop is tested, not the bar)
LOOP = dict(rounds=2, max_iterations=1, profile_steps=4, after=3, time_limit_s=5.0, min_gain=0.0)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The round-robin plan of tiny: a baseline the optimizer moves away from."""
    path = tmp_path_factory.mktemp("rr") / "rr.json"
    assert (
        main(["plan", "round-robin", "--workload", "tiny", "--world-size", "2", "--out", str(path)])
        == 0
    )
    return str(path)


def test_the_interval_is_of_the_per_round_ratios():
    med, low, high = ratio_interval([1.2, 1.25, 1.3, 1.22, 1.28])
    assert med == 1.25 and 1.2 <= low < med < high <= 1.3
    assert ratio_interval([0.9, 1.1, 1.0])[1] < 1.0 < ratio_interval([0.9, 1.1, 1.0])[2]


def test_the_candidate_must_beat_every_model_of_the_baseline():
    # one baseline model landed slow (7 % in every round): against it alone the candidate
    # measures faster, against the other model of the same plan it does not
    cand = [[10.0, 10.1, 9.9, 10.0, 10.05, 9.95]] * 2
    slow = [x / 1.07 for x in cand[0]]
    even = [10.1, 9.9, 10.0, 10.05, 9.9, 10.0]
    assert ratio_interval([c / b for c, b in zip(cand[0], slow, strict=True)])[1] > 1.0
    ratios, ratio, low, high = ab_interval(cand, [slow, even])
    assert low < 1.0 < ratio < high
    # per round the geometric means' ratio: round 0 is 10 / sqrt(10 / 1.07 * 10.1)
    assert ratios[0] == pytest.approx(10.0 / (10.0 / 1.07 * 10.1) ** 0.5)
    # faster than both models in every round: shipped
    assert ab_interval(cand, [slow, [x / 1.05 for x in even]])[1] > 1.0


def _tune(tmp_path, baseline, out, echo=lambda s: None, **ab_hook):
    """`tune` of tiny on 2 ranks against `baseline`, its A/B runs under `ab_hook`."""
    cfg = TrainConfig(workload="tiny", nproc=2, steps=10, warmup=2)
    return tune(cfg, out, tmp_path / "work", main, baseline=baseline, echo=echo, **ab_hook, **LOOP)


@pytest.mark.slow
def test_a_candidate_that_measured_slower_is_not_shipped(tmp_path, baseline):
    out = tmp_path / "shipped.json"
    slow = {"ab_hook": "rank_hooks:SlowPlan", "ab_hook_args": {"plan_name": "plan1.json"}}
    said: list[str] = []
    res = _tune(tmp_path, baseline, out, echo=said.append, **slow)
    assert res.candidate.endswith("plan1.json") and len(res.ab_ratios) == 2
    # each re-plan's choices, as `sparselift optimize` printed them, are in tune's output
    choices = [line for line in said if line.startswith("tune: optimize: choices: pipeline ")]
    assert len(choices) == len(res.iterations)
    # and the speedup each re-plan was predicted over TorchRec's plan
    speedups = [line for line in said if line.endswith("× predicted speedup")]
    assert len(speedups) == len(res.iterations) and speedups[0].startswith(
        "tune: optimize: TorchRec ("
    )
    assert res.high is not None and res.high < 1.0 and res.shipped == "baseline"
    assert out.read_bytes() == open(baseline, "rb").read()
    rec = json.loads((tmp_path / "work" / "tune.json").read_text())
    assert rec["shipped"] == "baseline" and rec["iterations"][0]["measured_step_s"] > 0
    # the candidate's profile was calibrated together with the baseline's (at fp32, at 16 bits,
    # with a table row-wise and with small tables data-parallel): each is checked by the fit on
    # the others, and 16 bits, the reduce-scatter and the dense TBE's backward are priced as
    # measured
    held = rec["iterations"][1]["held_out"]
    names = [h["profile"].rsplit("/", 1)[-1] for h in held]
    assert names == [
        "profile1",
        "profile1-baseline",
        "profile1-model-2",
        "profile0",
        "profile0-16bit",
        "profile0-row-wise",
        "profile0-data-parallel",
        "profile0-model-2",
    ]
    assert all(h["measured_step_s"] > 0 for h in held)
    # the baseline profiled beside the candidate levels the first job's speed with the second's
    work = tmp_path / "work"
    beside = steady_steps(work / "profile1-baseline").median_s
    assert rec["iterations"][1]["baseline_step_s"] == pytest.approx(beside, rel=1e-12)
    # each plan's step is that of its two models together (the baseline's, first, too)
    first, second = (
        models_step_s(str(work / p), str(work / f"{p}-model-2")) for p in ("profile0", "profile1")
    )
    assert rec["iterations"][1]["measured_step_s"] == pytest.approx(second, rel=1e-12)
    assert rec["iterations"][0]["baseline_step_s"] == pytest.approx(first, rel=1e-12)
    level = first / beside
    assert [h.get("level", 1.0) for h in held] == pytest.approx([1, 1, 1, *[level] * 5])
    cal = json.loads((tmp_path / "work" / "profile1" / "calibration.json").read_text())
    assert cal["ops"]["qcomm_quantize"]["n"] > 0 and cal["ops"]["output_dist_rs_fwd"]["n"] > 0
    assert cal["ops"]["lookup_bwd"]["dense_scale"] > 0
    report = tmp_path / "tune.html"
    write_tune_report(report, res, tmp_path / "work")
    page = report.read_text()
    assert page.index("Verdict") < page.index("Iterations: predicted vs measured step")
    assert f"{round(res.iterations[1].measured_step_s * 1e3, 3):.4g}" in page  # the table's format
    assert "Joint calibration: leave-one-out" in page and "A/B: median" in page


@pytest.mark.slow
def test_a_split_candidates_profile_is_fitted_with_the_rest_and_a_return_ends_the_loop(
    tmp_path, baseline
):
    """The loop's decisions are forced (the first re-plan is a split plan, the second the
    baseline again); its profiles, fits and re-plans are real."""
    from test_plans_virtual import split_plan

    from sparselift import plans

    forced = [plans.load(baseline)]  # popped from the end: the split plan first
    forced.append(split_plan(2))
    optimized: list[tuple[list[str], dict]] = []  # each re-plan's command and its own plan

    def run(argv: list[str]) -> int:
        code = main(argv)
        if argv[0] == "optimize" and code == 0:
            out = argv[argv.index("--out") + 1]
            doc = json.loads(open(out).read())
            optimized.append((argv, doc))
            plans.save(forced.pop(), out)
            forced_doc = json.loads(open(out).read())
            open(out, "w").write(json.dumps({**forced_doc, "predicted": doc["predicted"]}))
        return code

    cfg = TrainConfig(workload="tiny", nproc=2, steps=10, warmup=2)
    loop = {**LOOP, "max_iterations": 3}
    work = tmp_path / "work"
    quiet = {"echo": lambda s: None}
    res = tune(cfg, tmp_path / "out.json", work, run, baseline=baseline, **quiet, **loop)

    # the split plan's profile, of its virtual tables, is fitted with the baseline's ...
    held = [h["profile"].rsplit("/", 1)[-1] for h in res.iterations[1].held_out]
    assert held == [
        "profile1",
        "profile1-baseline",
        "profile1-model-2",
        "profile0",
        "profile0-16bit",
        "profile0-row-wise",
        "profile0-data-parallel",
        "profile0-model-2",
    ]
    assert json.loads((work / "profile1" / "manifest.json").read_text())["model_tables"]
    # ... and re-planned from every profile, the statistics read from the baseline's beside it
    argv, doc = optimized[1]
    given = [argv[i + 1] for i, x in enumerate(argv) if x == "--profile"]
    assert [g.rsplit("/", 1)[-1] for g in given] == [
        "profile1",
        "profile1-sparse-dist",
        "profile1-baseline",
        "profile1-model-2",
        "profile0",
        "profile0-sparse-dist",
        "profile0-16bit",
        "profile0-row-wise",
        "profile0-data-parallel",
        "profile0-model-2",
    ]
    assert doc["provenance"]["profile"] == str(work / "profile1-baseline")
    # back to the baseline, already profiled: the loop ends there; the split plan is tried in
    # an A/B only where it ran faster beside the baseline
    assert len(res.iterations) == 2 and res.fixed_point
    split = res.iterations[1]
    # the split plan's transform and recombination, as its profile's steps paid them
    assert res.iterations[0].split_costs_s is None
    assert split.split_costs_s is not None and min(split.split_costs_s) > 0
    shown = iteration_table(res)["transform ms"].tolist()
    assert pd.isna(shown[0]) and shown[1] == round(split.split_costs_s[0] * 1e3, 3)
    if split.measured_step_s < split.baseline_step_s:
        assert res.candidate == split.plan and len(res.ab_ratios) == LOOP["rounds"] * res.ab_jobs
    else:
        assert res.candidate == baseline and res.shipped == "baseline" and res.ab_ratios == []


@pytest.mark.slow
def test_a_failing_rank_stops_tune_and_leaves_the_last_good_plan(tmp_path, baseline):
    out = tmp_path / "shipped.json"
    out.write_text("last good plan")
    with pytest.raises(RankFailed, match="injected failure on rank 1"):
        _tune(tmp_path, baseline, out, ab_hook="rank_hooks:CrashOnRank")
    assert out.read_text() == "last good plan"


def test_tune_tries_a_plan_at_its_own_gain_with_splits_alike(tmp_path):
    # tune measures every plan it tries, so it asks optimize for TRY_GAIN over the profiled plan
    # and over the best plan without splits, not optimize's margins for a plan shipped unmeasured
    import shutil
    from pathlib import Path

    from sparselift.tune import TRY_GAIN, StepFailed

    fixtures = Path(__file__).parent / "fixtures"
    calls: list[list[str]] = []

    def run(argv: list[str]) -> int:  # profiles copied from a fixture; optimize fails
        calls.append(argv)
        if argv[0] == "profile":
            outs = [argv[i + 1] for i, a in enumerate(argv) if a == "--out"]
            outs += [argv[i + 2] for i, a in enumerate(argv) if a == "--also"]
            for d in outs:
                shutil.copytree(fixtures / "profile_tiny_table_wise", d)
        return 3 if argv[0] == "optimize" else 0

    cfg = TrainConfig(workload="tiny", nproc=2, steps=10, warmup=2)
    out = tmp_path / "out.json"
    plan = str(fixtures / "tiny_table_wise.plan.json")
    with pytest.raises(StepFailed):
        tune(cfg, out, tmp_path / "work", run, baseline=plan, echo=lambda s: None)
    argv = calls[-1]
    assert argv[0] == "optimize" and not out.exists()
    for flag in ("--min-gain", "--split-margin"):
        assert float(argv[argv.index(flag) + 1]) == TRY_GAIN


def test_the_row_wise_variant_makes_the_largest_table_row_wise_in_even_blocks(tmp_path):
    from sparselift import plans
    from sparselift.tune_plans import row_wise_variant

    rr = tmp_path / "rr.json"
    argv = ["plan", "round-robin", "--workload", "tiny", "--world-size", "3"]
    assert main([*argv, "--out", str(rr)]) == 0  # t3, 100,000 rows, is tiny's largest
    variant = plans.load(row_wise_variant(str(rr), tmp_path))  # loading checks its shards
    before = {t.name: t for t in plans.load(rr).tables}
    moved = [t for t in variant.tables if t.sharding_type != before[t.name].sharding_type]
    rows = {t.name: t.num_embeddings * t.embedding_dim for t in variant.model}
    assert [t.name for t in moved] == [max(rows, key=rows.get)]
    assert moved[0].ranks == [0, 1, 2]
    assert [s.sizes[0] for s in moved[0].shards] == [33334, 33334, 33332]
    one = tmp_path / "one.json"
    assert (
        main(["plan", "round-robin", "--workload", "tiny", "--world-size", "1", "--out", str(one)])
        == 0
    )
    assert row_wise_variant(str(one), tmp_path) is None


def test_the_data_parallel_variant_replicates_the_small_tables_up_to_a_few_mib(tmp_path):
    from sparselift import plans
    from sparselift.tune_plans import (
        DATA_PARALLEL_VARIANT_MAX_BYTES,
        DATA_PARALLEL_VARIANT_TOTAL_BYTES,
        data_parallel_variant,
    )

    rr = tmp_path / "rr.json"
    argv = ["plan", "round-robin", "--workload", "tiny", "--world-size", "3"]
    assert main([*argv, "--out", str(rr)]) == 0
    variant = plans.load(data_parallel_variant(str(rr), tmp_path))  # loading checks it
    before = {t.name: t for t in plans.load(rr).tables}
    moved = [t for t in variant.tables if t.sharding_type != before[t.name].sharding_type]
    size = {t.name: t.num_embeddings * t.embedding_dim * 4 for t in variant.model}
    by_size = sorted(size, key=lambda n: (size[n], n))
    k = len(moved)
    assert sorted(t.name for t in moved) == sorted(by_size[:k])  # the smallest ones
    assert all(size[n] <= DATA_PARALLEL_VARIANT_MAX_BYTES for n in by_size[:k])
    total = sum(size[n] for n in by_size[:k])
    assert 1 <= k < len(size) and total <= DATA_PARALLEL_VARIANT_TOTAL_BYTES
    nxt = size[by_size[k]]  # the next table would break a bound
    assert (
        nxt > DATA_PARALLEL_VARIANT_MAX_BYTES
        or total + nxt > DATA_PARALLEL_VARIANT_TOTAL_BYTES
        or k == len(size) - 1
    )
    assert total > 1 << 20  # enough replicated weights for their optimizer pass to show
    assert all(t.compute_kernel == "dense" and t.ranks == [0, 1, 2] for t in moved)
    # a plan that already runs a data-parallel table measures them itself
    assert data_parallel_variant(str(tmp_path / "rr-data-parallel.json"), tmp_path) is None
    one = tmp_path / "one.json"
    assert main([*argv[:-1], "1", "--out", str(one)]) == 0
    assert data_parallel_variant(str(one), tmp_path) is None
    # no table small enough to replicate at little cost (the smallest takes 15 MB)
    big = tmp_path / "big.json"
    spec = Path(__file__).parents[1] / "benchmarks" / "workloads" / "two-heavy-tables.json"
    assert main([*argv[:2], "--workload", str(spec), "--world-size", "2", "--out", str(big)]) == 0
    assert data_parallel_variant(str(big), tmp_path) is None


def test_the_ab_tries_the_plan_that_ran_fastest_beside_the_baseline():
    # (plan, its step, the baseline's step beside it): plan1 ran 1.2x, plan2 0.9x, plan3 1.1x
    tried = [("plan1", 0.10, 0.12), ("plan2", 0.10, 0.09), ("plan3", 0.10, 0.11)]
    assert fastest_beside_baseline(tried, "plan3") == "plan1"
    assert fastest_beside_baseline(tried[1:], "plan2") == "plan3"
    # none ran faster than the baseline beside it: the plan the loop ended at
    assert fastest_beside_baseline(tried[1:2], "plan2") == "plan2"
    assert fastest_beside_baseline([], "torchrec.plan.json") == "torchrec.plan.json"


def test_plans_that_list_their_tables_in_another_order_shard_the_same(tmp_path):
    # a kept profiled plan lists its tables as the model does, a solved one by name: the loop
    # must see the same plan (not profile it again)
    from sparselift.tune_plans import same_sharding

    rr = tmp_path / "rr.json"
    argv = ["plan", "round-robin", "--workload", "tiny", "--world-size", "2", "--out", str(rr)]
    assert main(argv) == 0
    plan = json.loads(rr.read_text())
    plan["tables"].reverse()
    (tmp_path / "reordered.json").write_text(json.dumps(plan))
    assert same_sharding(rr, tmp_path / "reordered.json")
    plan["tables"][0]["ranks"] = [1 - plan["tables"][0]["ranks"][0]]
    (tmp_path / "moved.json").write_text(json.dumps(plan))
    assert not same_sharding(rr, tmp_path / "moved.json")


def _simulated_bench(speedups: list[float], noise: float, seed: int):
    """A stand-in for `run_bench`: job k's candidate models run `speedups[k]` times the
    baseline's steps/s, each round of each model off by lognormal noise of sd `noise`."""
    import numpy as np

    from sparselift.bench import BenchResult

    rng = np.random.default_rng(seed)
    rounds_run: list[int] = []

    def bench(cfg, contenders, rounds, echo=None):
        speed = speedups[len(rounds_run)]
        rounds_run.append(rounds)
        for c in contenders:
            gain = speed if c.label.startswith("candidate") else 1.0
            c.steps_per_s = list(10.0 * gain * np.exp(rng.normal(0.0, noise, rounds)))
        return BenchResult("sim", 2, rounds, 10, contenders)

    return bench, rounds_run


def test_an_open_ab_runs_a_second_job_and_judges_both_jobs_rounds(tmp_path):
    from sparselift.tune_ab import CONFIDENCE, run_ab

    cfg = TrainConfig(workload="tiny", nproc=2, steps=10)
    said: list[str] = []
    # 1.05x at 3 % noise a round (seed 2): 8 rounds leave it open, 14 ship it
    bench, rounds_run = _simulated_bench([1.05, 1.05], 0.03, seed=2)
    ab = run_ab(cfg, tmp_path, "cand.json", "base.json", 8, said.append, 6, bench=bench)
    assert rounds_run == [8, 6] and ab.jobs == 2 and len(ab.ratios) == 14
    assert ab.confidence == pytest.approx(1 - (1 - CONFIDENCE) / 2)
    assert any(line.startswith("tune: A/B undecided after 8 rounds") for line in said)
    assert (tmp_path / "bench-2.json").exists() and ab.shipped == "candidate"
    assert "14 rounds side by side in 2 jobs" in ab.reason
    # decided by the first job (clearly faster, or clearly not): no second job
    for speed, shipped in ((1.5, "candidate"), (0.7, "baseline")):
        bench, rounds_run = _simulated_bench([speed, 1.0], 0.02, seed=4)
        ab = run_ab(cfg, tmp_path, "cand.json", "base.json", 8, said.append, 8, bench=bench)
        assert rounds_run == [8] and ab.jobs == 1 and ab.shipped == shipped
    # no second job asked for: one look at the full confidence
    bench, rounds_run = _simulated_bench([1.05, 1.05], 0.03, seed=2)
    ab = run_ab(cfg, tmp_path, "cand.json", "base.json", 8, said.append, 0, bench=bench)
    assert rounds_run == [8] and ab.confidence == CONFIDENCE and ab.shipped == "baseline"


def test_a_second_look_ships_a_plan_that_is_no_faster_no_more_often(tmp_path):
    # seeded A/Bs at 3 % noise a round: a plan no faster ships as rarely with the second job as
    # with one look at the full confidence, and a 5 % faster plan ships more often
    from sparselift.tune_ab import run_ab

    cfg = TrainConfig(workload="tiny", nproc=2, steps=10)

    def ship_rate(speed: float, more: int) -> float:
        shipped = 0
        for seed in range(150):
            bench, _ = _simulated_bench([speed, speed], 0.03, seed)
            ab = run_ab(cfg, tmp_path, "c.json", "b.json", 8, lambda s: None, more, bench=bench)
            shipped += ab.shipped == "candidate"
        return shipped / 150

    assert ship_rate(1.0, 8) <= max(ship_rate(1.0, 0), 0.05)
    assert ship_rate(1.05, 8) > ship_rate(1.05, 0)
    # the default second job, twice the first's rounds: more often again, and still not a plan
    # that is no faster
    assert ship_rate(1.05, 16) > ship_rate(1.05, 8)
    assert ship_rate(1.0, 16) <= max(ship_rate(1.0, 0), 0.05)


def test_the_second_job_runs_twice_the_first_jobs_rounds_unless_told():
    from sparselift.tune_ab import second_job_rounds
    from sparselift.workloads.harness import MAX_ROUNDS

    assert second_job_rounds(8, None) == 16
    assert second_job_rounds(MAX_ROUNDS, None) == MAX_ROUNDS  # never past the harness's limit
    assert second_job_rounds(8, 5) == 5 and second_job_rounds(8, 0) == 0
