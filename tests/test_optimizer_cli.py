"""`sparselift optimize`: deterministic plan files, refusals (exit 2, no plan file), and the plan
trains."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from plans_helpers import train_as_planned

from sparselift import plans
from sparselift.cli import main


def _run(*args: str) -> int:
    return main(["optimize", *args])


def test_same_inputs_same_bytes(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert _run("--workload", "tiny", "--out", str(a), "--time-limit", "5") == 0
    assert _run("--workload", "tiny", "--out", str(b), "--time-limit", "5") == 0
    assert a.read_bytes() == b.read_bytes()
    plan = json.loads(a.read_text())
    s = plan["solver"]
    assert (
        0 <= s["gap"] < 1 and s["bound"] <= s["objective"] and plan["predicted"]["step_time_s"] > 0
    )


def test_what_if_gpu_topology_multi_host(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert (
        _run(
            "--workload",
            "multihot-26",
            "--device",
            "h200x8",
            "--world-size",
            "16",
            "--out",
            str(out),
            "--time-limit",
            "4",
            "--no-baseline",
        )
        == 0
    )
    from sparselift import plans

    plan = plans.load(out)
    assert plan.topology.world_size == 16 and plan.topology.device == "cuda"
    assert "HBM per rank" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case", ["no-calibration", "bad-topology", "bad-topology-json", "too-big", "empty"]
)
def test_refusals(tmp_path, capsys, case):
    out = tmp_path / "plan.json"
    if case == "no-calibration":
        (tmp_path / "prof").mkdir()
        args = ["--profile", str(tmp_path / "prof")]
        want = "sparselift analyze"
    elif case == "bad-topology":
        f = tmp_path / "t.json"
        f.write_text(
            json.dumps(
                {"format": "sparselift-topology", "version": 1, "world_size": 2, "device": "tpu"}
            )
        )
        args, want = ["--workload", "tiny", "--topology", str(f)], "device"
    elif case == "bad-topology-json":
        f = tmp_path / "t.json"
        f.write_text('{"format": ')
        args, want = ["--workload", "tiny", "--topology", str(f)], "malformed JSON"
    elif case == "too-big":
        f = tmp_path / "t.json"
        f.write_text(
            json.dumps(
                {
                    "format": "sparselift-topology",
                    "version": 1,
                    "base": "cpu-gloo",
                    "world_size": 2,
                    "ddr_bytes": 4 * 2**20,
                }
            )
        )
        args, want = ["--workload", "tiny", "--topology", str(f)], "largest tables"
    else:
        f = tmp_path / "w.json"
        f.write_text(
            json.dumps(
                {
                    "name": "e",
                    "batch_size": 8,
                    "dense_in_features": 1,
                    "model": {"arch": "dlrm", "dense_arch": [4], "over_arch": [4, 1]},
                    "tables": [],
                }
            )
        )
        args, want = ["--workload", str(f)], "no tables"
    assert _run(*args, "--out", str(out), "--no-baseline") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and want in err[0]
    assert not out.exists() and not list(tmp_path.glob(".plan.json*"))


@pytest.mark.parametrize("gpu", ["NVIDIA H200", None])
def test_a_cuda_profile_is_planned_for_its_gpu_not_for_a_cpu(tmp_path, capsys, gpu):
    prof, out = tmp_path / "prof", tmp_path / "p.json"
    shutil.copytree(Path(__file__).parent / "fixtures" / "profile_tiny_table_wise", prof)
    assert main(["analyze", str(prof)]) == 0
    cal = json.loads((prof / "calibration.json").read_text())
    assert (
        cal["provenance"]["manifest"]["local_world_size"] == 2
    )  # what the profile ran on travels along
    cal["device"] = "cuda"  # as if profiled on GPUs, which this machine has none of
    cal["provenance"]["manifest"]["gpu"] = gpu
    (prof / "calibration.json").write_text(json.dumps(cal))
    capsys.readouterr()
    rc = _run("--profile", str(prof), "--out", str(out), "--time-limit", "4", "--no-baseline")
    if gpu:
        assert rc == 0
        topo = plans.load(out).topology
        assert (topo.device, topo.preset, topo.world_size, topo.local_world_size) == (
            "cuda",
            "h200x8",
            2,
            2,
        )
    else:  # no preset to plan with: said, not planned for a CPU instead
        assert rc == 2 and not out.exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert (
            len(err) == 1
            and "profiled on CUDA" in err[0]
            and "--device" in err[0]
            and str(prof) in err[0]
        )


@pytest.mark.slow
def test_plan_loads_and_trains(tmp_path):
    out = tmp_path / "p.json"
    assert _run("--workload", "tiny", "--out", str(out), "--time-limit", "5", "--no-baseline") == 0
    result = train_as_planned(out)  # every table trained as the plan says
    assert result.pipeline == plans.load(out).pipeline


@pytest.mark.slow
def test_a_large_model_whose_presolve_spends_the_budget_still_gets_a_plan(tmp_path, capsys):
    """300 tables x 64 ranks with 2 s: CP-SAT's presolve alone used the deterministic budget of
    the aggregate model (status UNKNOWN, no plan); the solver then solves without presolve."""
    from sparselift.optimizer.synthetic import synthetic_workload

    spec = tmp_path / "syn300.json"
    spec.write_text(json.dumps(synthetic_workload(300, seed=3)))
    out = tmp_path / "p.json"
    args = ["--workload", str(spec), "--world-size", "64", "--device", "h100x8"]
    assert _run(*args, "--no-baseline", "--time-limit", "2", "--out", str(out)) == 0
    plan = plans.load(out)
    assert len(plan.tables) == 300 and plan.solver["status"].startswith("FEASIBLE")
