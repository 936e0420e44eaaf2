"""Two hosts on one machine: two `sparselift` launchers, one gloo rank each, static rendezvous.

Node 1's `--out` is a different directory than node 0's: the profile must still arrive complete
on node 0 (its traces streamed over the process group), and node 1's directory must stay unmade.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

COMMON = ["--workload", "tiny", "--nproc", "1", "--nnodes", "2", "--warmup", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(node: int, port: int, *args: str) -> subprocess.Popen[str]:
    """One host's launcher: `sparselift ARGS --node-rank NODE` against 127.0.0.1:PORT."""
    cmd = [sys.executable, "-m", "sparselift.cli", *args, *COMMON, "--node-rank", str(node)]
    cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60"]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def kill_host(pid: int) -> None:
    """SIGKILL a launcher and every process under it, as if its host died (the elastic agent
    starts each rank in a session of its own, so a process-group kill would miss them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def both(args0: list[str], args1: list[str]) -> list[tuple[int, str, str]]:
    """Run node 0 and node 1 to the end; (exit code, stdout, stderr) of each."""
    port = free_port()
    procs = [start(0, port, *args0), start(1, port, *args1)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        out.append((p.returncode, stdout, stderr))
    return out


@pytest.mark.slow
def test_two_hosts_train_and_every_host_reports_the_whole_run(tmp_path):
    args = ["train", "--steps", "2"]
    results = both(
        [*args, "--json", str(tmp_path / "n0.json")], [*args, "--json", str(tmp_path / "n1.json")]
    )
    for code, _, err in results:
        assert code == 0, err
    r0, r1 = (json.loads((tmp_path / f"n{i}.json").read_text()) for i in (0, 1))
    assert r0["world_size"] == 2 and [r["rank"] for r in r0["ranks"]] == [0, 1]
    assert all(len(r["step_times_s"]) == 3 for r in r0["ranks"])
    assert r0["ranks"] == r1["ranks"]  # every host gathered every rank's own result


@pytest.mark.slow
def test_profile_gathers_on_node0_without_a_shared_directory(tmp_path):
    out0, out1 = tmp_path / "node0", tmp_path / "node1"
    args = ["profile", "--steps", "2", "--after", "2", "--steady-steps", "2"]
    (c0, s0, e0), (c1, s1, e1) = both([*args, "--out", str(out0)], [*args, "--out", str(out1)])
    assert c0 == 0 and c1 == 0, e0 + e1
    assert not out1.exists()  # node 1 wrote nothing of its own
    assert "profile is on node 0" in s1
    m = json.loads((out0 / "manifest.json").read_text())
    assert m["world_size"] == 2 and m["local_world_size"] == 1
    assert m["hosts"] == [socket.gethostname()] * 2 and m["missing_ranks"] == []
    assert m["files"]["traces"] == ["rank0.trace.json.gz", "rank1.trace.json.gz"]
    assert (out0 / "rank1.trace.json.gz").stat().st_size > 1000
    assert not list(out0.glob(".*tmp*"))

    from sparselift.analysis.pipeline import analyze

    a = analyze(out0, cache=False)
    assert sorted(set(a.summary["rank"])) == [0, 1]
    assert (a.summary["sparse_path_s"] > 0).all()


@pytest.mark.slow
def test_hosts_that_disagree_stop_at_the_rendezvous(tmp_path):
    t0 = time.monotonic()
    results = both(["train", "--steps", "2"], ["train", "--steps", "2", "--seed", "7"])
    assert time.monotonic() - t0 < 90
    for code, stdout, err in results:
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert "node 1" in lines[0] and "seed 7" in lines[0] and "node 0 has 0" in lines[0]
        assert "steps/s" not in stdout  # nothing trained


@pytest.mark.slow
def test_a_host_dying_mid_profile_stops_node0_and_leaves_no_profile(tmp_path):
    out0 = tmp_path / "node0"
    port = free_port()
    args = ["profile", "--steps", "2", "--after", "300", "--steady-steps", "2"]
    n0 = start(0, port, *args, "--out", str(out0))
    n1 = start(1, port, *args, "--out", str(tmp_path / "node1"))
    assert n0.stdout is not None
    for line in n0.stdout:  # past the window: rank 0 has written its own trace by now
        if "step 30/" in line:
            break
    kill_host(n1.pid)
    t0 = time.monotonic()
    _, err = n0.communicate(timeout=120)
    n1.wait()
    assert n0.returncode == 1, err
    assert time.monotonic() - t0 < 30
    assert "rank 0 failed" in err
    assert list(out0.iterdir()) == []  # no manifest, no trace, nothing half-written


def test_an_unreachable_endpoint_is_one_line_within_the_timeout(cli):
    t0 = time.monotonic()
    code, _, err = cli(
        "train",
        *COMMON,
        "--node-rank",
        "1",
        "--rdzv-endpoint",
        f"127.0.0.1:{free_port()}",
        "--rdzv-timeout",
        "2",
    )
    assert code == 2 and time.monotonic() - t0 < 10
    assert err.count("\n") == 1 and "unreachable from node 1 within --rdzv-timeout 2 s" in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--nnodes", "2"], "--rdzv-endpoint must be HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank must be"),
        (["--nnodes", "0"], "--nnodes must be"),
    ],
)
def test_bad_node_flags_are_refused_before_anything_starts(cli, flags, message):
    code, _, err = cli("train", "--workload", "tiny", "--nproc", "1", *flags)
    assert code == 2 and message in err


CRASHING_HOST = """
import sys
from sparselift.errors import UserError
from sparselift.workloads.harness import TrainConfig, run_training
from sparselift.workloads.launch import RankFailed
try:
    run_training(TrainConfig(
        workload="tiny", nproc=1, steps=200, warmup=0, hook="rank_hooks:CrashOnRank",
        nnodes=2, node_rank=int(sys.argv[1]), rdzv_endpoint=sys.argv[2], rdzv_timeout_s=60))
except (RankFailed, UserError) as e:
    print(e)
"""


@pytest.mark.slow
def test_a_failing_host_stops_the_others_with_its_error(tmp_path):
    script = tmp_path / "host.py"
    script.write_text(CRASHING_HOST)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(node), endpoint],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        for node in (0, 1)
    ]
    node0, node1 = (p.communicate(timeout=240)[0] for p in procs)
    # rank 1 (node 1) raises at step 1 of 200; node 0 stops with node 1's own error
    assert "node 1 (rank 1) failed: RuntimeError: injected failure on rank 1" in node0
    assert "rank 1 failed: RuntimeError: injected failure on rank 1" in node1


@pytest.mark.slow
def test_an_external_torchrun_runs_the_profile_unchanged(tmp_path):
    out = tmp_path / "prof"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node"]
    cmd += ["2", "-m", "sparselift.cli", "profile", "--workload", "tiny", "--warmup", "1"]
    cmd += ["--steps", "2", "--after", "2", "--steady-steps", "2", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("profiled steps 1..2 of tiny on 2 ranks") == 1  # rank 0 reports
    m = json.loads((out / "manifest.json").read_text())
    assert m["world_size"] == 2 and m["local_world_size"] == 2 and m["missing_ranks"] == []
    assert m["files"]["traces"] == ["rank0.trace.json.gz", "rank1.trace.json.gz"]


@pytest.mark.slow
def test_a_trace_over_the_cap_is_named_missing_and_analysis_refuses_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSELIFT_GATHER_CAP_BYTES", "1000")  # every trace is larger
    out = tmp_path / "prof"
    code, _, err = cli(
        "profile",
        "--workload",
        "tiny",
        "--nproc",
        "2",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--after",
        "0",
        "--steady-steps",
        "0",
        "--out",
        out,
    )
    assert code == 1 and "rank 1's trace is missing" in err and "over the cap of 1,000" in err
    m = json.loads((out / "manifest.json").read_text())
    assert m["missing_ranks"] == [1] and m["files"]["traces"] == ["rank0.trace.json.gz"]
    assert not (out / "rank1.trace.json.gz").exists()

    from sparselift.analysis.pipeline import analyze
    from sparselift.errors import UserError

    with pytest.raises(UserError, match=r"rank\(s\) 1 are missing.*--allow-missing-ranks"):
        analyze(out, cache=False)
    assert set(analyze(out, cache=False, allow_missing_ranks=True).nodes["rank"]) == {0}


def _table_row_wise_plan(path: Path) -> Path:
    """`tiny` on 2 hosts of 1 rank: every table row-wise over one host's ranks, hosts in turn."""
    from sparselift import plans
    from sparselift.optimizer.planio import to_plan
    from sparselift.optimizer.space import FUSED, TWRW, Choice, OptionClass, PlanWide
    from sparselift.optimizer.table_stats import stats_from_spec
    from sparselift.optimizer.topology import preset
    from sparselift.workloads.spec import load_workload

    stats = stats_from_spec(load_workload("tiny"))
    topo = preset("cpu-gloo", 2, 1)
    choices = {t.name: Choice(OptionClass(TWRW, FUSED, 1), host=i % 2) for i, t in enumerate(stats)}
    plans.save(to_plan(stats, choices, topo, PlanWide()), path)
    return path


@pytest.mark.slow
def test_a_table_row_wise_plan_trains_on_two_hosts_and_calibrates_the_inter_host_cost(tmp_path):
    from sparselift.analysis.pipeline import analyze
    from sparselift.optimizer.coefficients import coefficients
    from sparselift.optimizer.topology import preset

    plan = _table_row_wise_plan(tmp_path / "twrw.json")
    out0 = tmp_path / "node0"
    args = ["profile", "--plan", str(plan), "--steps", "4", "--after", "2", "--steady-steps", "2"]
    (c0, _, e0), (c1, _, e1) = both([*args, "--out", str(out0)], [*args, "--out", str(out0)])
    assert c0 == 0 and c1 == 0, e0 + e1
    m = json.loads((out0 / "manifest.json").read_text())
    assert {e["sharding_type"] for e in m["sharding"]} == {"table_row_wise"}
    cal = analyze(out0, cache=False).calibration
    assert cal.provenance.manifest["local_world_size"] == 1
    # planning for a 2-host topology prices bytes between hosts with the profile's own fits
    coeffs = coefficients(preset("h100x8", 16), cal)  # another device kind: not carried over
    assert not coeffs.measured("inter_host_b_s")
    coeffs = coefficients(preset("cpu-gloo", 4, 2), cal)
    assert coeffs.measured("inter_host_b_s")
    # a table-row-wise table's output calls are fitted as the reduce-scatter kinds
    assert {"output_dist_rs_fwd", "output_dist_rs_bwd"} <= set(cal.ops)
    assert "output_dist_fwd" not in cal.ops
    fits = [cal.ops[k].b_s for k in ("input_dist", "output_dist_rs_fwd", "output_dist_rs_bwd")]
    assert coeffs.inter_host_b_s == max(fits) > 0
