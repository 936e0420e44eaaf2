"""Profiles side by side in one job: `sparselift profile --also` and `profile_side_by_side` on
real 2-rank gloo training of `tiny`."""

from __future__ import annotations

import json

import pytest
from plans_helpers import round_robin

from sparselift import plans
from sparselift.cli import main
from sparselift.optimizer.profile_input import plan_in_force
from sparselift.profiler.from_ranks import profile_side_by_side
from sparselift.workloads.harness import TrainConfig

WARMUP, STEPS, STEADY, ROUNDS = 1, 2, 4, 2


@pytest.mark.slow
def test_profile_also_writes_one_profile_per_plan_from_one_job(tmp_path):
    rr, half = tmp_path / "rr.json", tmp_path / "rr-16bit.json"
    plans.save(round_robin(2), rr)
    doc = json.loads(rr.read_text())
    half.write_text(json.dumps({**doc, "comm_precision": {"forward": "fp16", "backward": "fp16"}}))
    a, b = tmp_path / "a", tmp_path / "b"
    argv = ["profile", "--workload", "tiny", "--nproc", "2", "--plan", str(rr), "--out", str(a)]
    flags = ["--warmup", str(WARMUP), "--steps", str(STEPS), "--steady-steps", str(STEADY)]
    assert main([*argv, "--also", str(half), str(b), *flags, "--rounds", str(ROUNDS)]) == 0

    # each plan: its warm-up with its window inside, then per round an untimed step and its turn
    per_plan = WARMUP + STEPS + ROUNDS * (1 + STEADY // ROUNDS)
    jobs = set()
    for d, precision in [(a, "fp32"), (b, "fp16")]:
        m = json.loads((d / "manifest.json").read_text())
        assert m["side_by_side_plans"] == [str(rr), str(half)]
        jobs.add(m["side_by_side_job"])
        assert m["comm_precision"] == {"forward": precision, "backward": precision}
        assert m["profiled_steps"] == list(range(WARMUP, WARMUP + STEPS))
        assert [len(t) for t in m["step_times_s"]] == [per_plan, per_plan]
        assert len(m["steady_step_s"]) == STEADY and all(s > 0 for s in m["steady_step_s"])
        assert m["steady_turn_steps"] == STEADY // ROUNDS
        # the kernels timed in its window and every step it ran after it
        after = per_plan - WARMUP - STEPS
        assert [(len(r["window"]), len(r["steady"])) for r in m["lookup_s"]] == [(STEPS, after)] * 2
        assert all(x > 0 for r in m["lookup_s"] for s in r["window"] + r["steady"] for x in s)
        assert sorted(p.name for p in d.glob("rank*.trace.json.gz")) == [
            "rank0.trace.json.gz",
            "rank1.trace.json.gz",
        ]
        assert "--also" in m["command"]
    assert len(jobs) == 1 and all(isinstance(j, str) and j for j in jobs)  # one job, named
    assert main(["analyze", str(a), str(b)]) == 0
    assert (a / "calibration.json").exists()


@pytest.mark.slow
def test_a_contender_without_a_directory_is_trained_but_not_profiled(tmp_path):
    rr = tmp_path / "rr.json"
    plans.save(round_robin(2), rr)
    cfg = TrainConfig(
        workload="tiny", nproc=2, steps=2, rounds=2, device="cpu", contenders=[str(rr), None]
    )
    out = tmp_path / "p"
    out.mkdir()
    measured, errors = profile_side_by_side(cfg, [out, None], warmup=WARMUP, steps=STEPS)
    assert errors == []
    assert measured.hooks[1] == [{}, {}] and "facts" in measured.hooks[0][0]
    assert [len(c) for c in measured.step_times_s] == [ROUNDS, ROUNDS]
    m = json.loads((out / "manifest.json").read_text())
    assert m["side_by_side_plans"] == [str(rr), None]
    assert m["steady_step_s"] == [s for turn in measured.step_times_s[0] for s in turn]
    assert m["steady_turn_steps"] == cfg.steps


@pytest.mark.slow
def test_a_split_plans_profile_is_of_the_same_job_and_fitted_with_the_unsplit_one(tmp_path, cli):
    from test_plans_virtual import split_plan

    rr, split = tmp_path / "rr.json", tmp_path / "split.json"
    plans.save(round_robin(2), rr)
    plans.save(split_plan(2), split)
    a, b = tmp_path / "a", tmp_path / "b"
    argv = ["profile", "--workload", "tiny", "--nproc", "2", "--plan", str(rr), "--out", str(a)]
    flags = ["--warmup", str(WARMUP), "--steps", str(STEPS), "--steady-steps", str(STEADY)]
    assert main([*argv, "--also", str(split), str(b), *flags, "--rounds", str(ROUNDS)]) == 0

    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    assert ma["model_tables"] is None
    model = [
        {k: t[k] for k in ("name", "num_embeddings", "embedding_dim", "feature_names")}
        for t in ma["tables"]
    ]
    assert mb["model_tables"] == model  # the model's own tables, beside the virtual ones
    # the split model's own costs, timed in its steady steps on every rank; none without splits
    assert ma["split_cost_s"] is None and len(mb["split_cost_s"]) == 2
    for records in mb["split_cost_s"]:
        assert records and all(r[0] > 0 and r[2] > 0 and r[3] > 0 for r in records)
    assert {"t3__hot", "t5__rows1", "t7__cols0"} <= {t["name"] for t in mb["tables"]}
    rebuilt, ran = plan_in_force(mb), plans.load(split)  # the plan in force, from the manifest
    assert rebuilt is not None and plan_in_force(ma) is not None
    assert (rebuilt.model, rebuilt.tables, rebuilt.splits) == (ran.model, ran.tables, ran.splits)

    code, out, _ = cli("analyze", str(b), str(a))
    assert code == 0, out
    cal = json.loads((b / "calibration.json").read_text())
    assert sorted(h["profile"] for h in cal["held_out"]) == sorted([str(a), str(b)])
    # the split's own costs are measured on the profile whose steps timed them, and that alone
    assert cal["split_cost_profiles"] == [str(b)]
    assert cli("analyze", str(a))[0] == 0  # the plan without splits: timed stand-alone only
    assert "split_cost_profiles" not in json.loads((a / "calibration.json").read_text())

    # planning reads the statistics from the profile without splits, wherever it is given
    code, _, err = cli("optimize", "--profile", str(b), "--splits", "off", "--out", "p.json")
    assert code == 2 and "a plan without splits too" in err
    p = tmp_path / "p.json"
    code, out, _ = cli("optimize", "--profile", str(b), "--profile", str(a), "--out", str(p))
    assert code == 0, out
    doc = json.loads(p.read_text())
    assert doc["provenance"]["profile"] == str(a)
    assert doc["provenance"]["profiles"] == [str(b), str(a)]
    # --splits off: the split plan in force is not kept as it is, however little a change gains
    argv = ["optimize", "--profile", str(b), "--profile", str(a), "--splits", "off"]
    code, out, _ = cli(*argv, "--min-gain", "100", "--out", str(p))
    assert code == 0, out
    assert "--splits is off" in out and not json.loads(p.read_text()).get("splits")

    # a split profile of another model is still another job's
    mb["model_tables"][3]["num_embeddings"] += 1
    (b / "manifest.json").write_text(json.dumps(mb))
    code, _, err = cli("analyze", str(a), str(b))
    assert code == 2 and "profiles of different jobs" in err and "'t3'" in err
