"""Plans trained side by side in one job (`sparselift.workloads.side_by_side`)."""

from __future__ import annotations

import statistics

import pytest
from plans_helpers import round_robin

from sparselift import plans
from sparselift.errors import UserError
from sparselift.plans import PlanError
from sparselift.workloads.harness import MAX_CONTENDERS, TrainConfig, run_ranks
from sparselift.workloads.side_by_side import run_side_by_side, turns


def test_turns_rotate_so_that_every_contender_goes_first_once_in_n_rounds():
    orders = [turns(3, r) for r in range(6)]
    assert orders[:3] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]] and orders[3:] == orders[:3]
    assert turns(1, 5) == [0]


def test_a_side_by_side_job_is_refused_before_any_rank_starts(tmp_path):
    rr = tmp_path / "rr.json"
    plans.save(round_robin(2), rr)
    base = TrainConfig(workload="tiny", nproc=2)
    with pytest.raises(UserError, match="contenders, not --plan"):
        TrainConfig(workload="tiny", plan=str(rr), contenders=[str(rr)]).validate()
    with pytest.raises(UserError, match=f"at most {MAX_CONTENDERS} plans side by side, got 17"):
        TrainConfig(workload="tiny", contenders=[str(rr)] * 17).validate()
    with pytest.raises(UserError, match="--rounds must be in 1..1,000, got 0"):
        TrainConfig(workload="tiny", contenders=[str(rr)], rounds=0).validate()
    with pytest.raises(PlanError, match="nope.json"):
        TrainConfig(workload="tiny", contenders=[None, str(tmp_path / "nope.json")]).validate()
    with pytest.raises(UserError, match="at least one plan"):
        run_side_by_side(base)


@pytest.mark.slow
def test_each_contender_trains_its_own_plan_and_is_timed_apart(tmp_path):
    """Two contenders in one 2-rank gloo job: each is sharded by its own plan, and a slowdown
    hooked to one of them shows in its steps only."""
    rr, slow = tmp_path / "rr.json", tmp_path / "slow.json"
    plans.save(round_robin(2), rr)
    plans.save(round_robin(2), slow)
    cfg = TrainConfig(
        workload="tiny",
        nproc=2,
        steps=3,
        warmup=1,
        rounds=2,
        device="cpu",
        contenders=[str(rr), str(slow), None],
        hook="rank_hooks:SlowPlan",
        hook_args={"plan_name": "slow.json", "delay_s": 0.05},
    )
    measured = run_side_by_side(cfg)
    assert [len(c) for c in measured.step_times_s] == [2, 2, 2]
    assert all(len(turn) == 3 for c in measured.step_times_s for turn in c)
    fast = statistics.median(s for turn in measured.step_times_s[0] for s in turn)
    assert all(s >= 0.05 for turn in measured.step_times_s[1] for s in turn)
    assert fast < statistics.median(s for turn in measured.step_times_s[1] for s in turn) - 0.03
    assert len(measured.steps_per_s(0)) == 2 and len(measured.peak_memory_bytes) == 2

    cfg.hook, cfg.hook_args, cfg.rounds = "rank_hooks:ShardingTypes", {}, 1
    _, ranks = run_ranks(cfg)
    hooks = ranks[0].extra["hooks"]
    assert len(hooks) == 3
    want = {t.name: t.ranks for t in plans.load(rr).tables}
    assert {name: t["ranks"] for name, t in hooks[0]["tables"].items()} == want
    assert hooks[1]["tables"] == hooks[0]["tables"]
    assert hooks[2]["tables"] != hooks[0]["tables"]  # TorchRec's planner, not round-robin
