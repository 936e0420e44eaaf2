"""TorchRec's planner beside the solve: a hard limit counted from the start, its warnings muted,
and the plan the same as when the solve waits for it."""

from __future__ import annotations

import time

from sparselift.cli import main
from sparselift.optimizer import torchrec_baseline
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset
from sparselift.optimizer.torchrec_baseline import BaselineRun

STATS = [TableStats(f"t{i}", 1000, 16, 2.0, feature_names=(f"t{i}",)) for i in range(2)]


def _slow_planner(seconds: float):
    real = torchrec_baseline.torchrec_baseline_plan

    def planner(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    return planner


def test_a_plan_finished_within_the_limit_counts_when_read_later():
    run = BaselineRun(STATS, preset("cpu-gloo", 2), 64, timeout_s=30)
    time.sleep(0.2)
    got = run.result()
    assert got.status == "ok" and got.plan is not None and got.seconds < 30
    assert run.result() is got  # read once


def test_a_plan_finished_after_the_limit_is_a_timeout_even_when_read_later(monkeypatch):
    monkeypatch.setattr(torchrec_baseline, "torchrec_baseline_plan", _slow_planner(1.0))
    run = BaselineRun(STATS, preset("cpu-gloo", 2), 64, timeout_s=0.5)
    time.sleep(2.0)  # the parent was busy: the child finished meanwhile, but too late
    got = run.result()
    assert got.status == "timeout" and got.plan is None


def test_a_cancelled_run_has_no_plan(monkeypatch):
    monkeypatch.setattr(torchrec_baseline, "torchrec_baseline_plan", _slow_planner(30.0))
    run = BaselineRun(STATS, preset("cpu-gloo", 2), 64, timeout_s=60)
    run.cancel()
    assert run.result().status == "cancelled" and run.result().plan is None


def test_optimize_is_quiet_about_torchrec_and_says_its_wall_time(tmp_path, capfd):
    out = tmp_path / "p.json"
    args = ["optimize", "--workload", "tiny", "--world-size", "4", "--device", "h100x8"]
    assert main([*args, "--time-limit", "4", "--out", str(out)]) == 0
    printed = capfd.readouterr()
    text = printed.out + printed.err
    assert "constructed directly" not in text and "WARNING" not in text
    assert "TorchRec's planner, given the statistics: ok" in text
    assert "optimize took" in printed.out.strip().splitlines()[-1]


def test_a_kept_torchrec_plan_is_named_as_the_planner_was_called(tmp_path, capfd):
    out = tmp_path / "p.json"
    args = ["optimize", "--workload", "tiny", "--world-size", "2", "--device", "cpu-gloo"]
    assert main([*args, "--time-limit", "4", "--min-gain", "10", "--out", str(out)]) == 0
    printed = capfd.readouterr().out
    (table,) = [x for x in printed.splitlines() if x.startswith("TorchRec (")]
    given = (
        "default plan" if table.startswith("TorchRec (defaults)") else "plan given the statistics"
    )
    assert f"kept TorchRec's {given}: ours was not predicted at least 1000% faster" in printed


def test_the_memory_refusal_names_need_room_and_the_largest_tables(tmp_path, capsys):
    topo = tmp_path / "t.json"
    topo.write_text(
        '{"format": "sparselift-topology", "version": 1, "base": "cpu-gloo", "world_size": 2,'
        ' "ddr_bytes": 4194304}'
    )
    args = ["--workload", "tiny", "--topology", str(topo), "--no-baseline"]
    assert main(["optimize", *args, "--out", str(tmp_path / "p.json")]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "need 32.5 MiB" in err and "2.8 MiB per rank × 2 ranks = 5.6 MiB" in err
    assert "no option of t3, t5, t7 fits one rank" in err
    assert "largest tables: t3 12.6 MiB, t7 10.1 MiB, t5 6.3 MiB" in err
