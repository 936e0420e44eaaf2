"""The GPU check: its report on real fixture profiles, its plans, and its CPU dry run."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sparselift import gpu_check
from sparselift.analysis.pipeline import analyze, write_outputs
from sparselift.errors import UserError
from sparselift.optimizer.table_stats import stats_from_profile

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """The two fixture profiles, copied and analyzed (calibration.json beside the traces)."""
    out = {}
    base = tmp_path_factory.mktemp("gpu_check")
    for name in ("row_wise", "table_wise"):
        d = base / name
        shutil.copytree(FIX / f"profile_tiny_{name}", d)
        write_outputs(analyze(d, cache=False), d)
        out[name] = d
    return out


def _window_median(profile: Path) -> float:
    m = json.loads((profile / "manifest.json").read_text())
    first, n = m["warmup"], len(m["profiled_steps"])
    return statistics.median(max(t[i] for t in m["step_times_s"]) for i in range(first, first + n))


def test_report_puts_the_fitted_lookups_beside_the_presets_and_prices_uvm_misses(profiles):
    a, b = str(profiles["row_wise"]), str(profiles["table_wise"])
    runs = [
        gpu_check.Run("fused", a),
        gpu_check.Run("uvm_small", b, "fused_uvm_caching", 0.1, baseline="fused", stand_in=True),
        gpu_check.Run("uvm_big", b, "fused_uvm_caching", 0.5, baseline="fused", stand_in=True),
    ]
    rep = gpu_check.report(runs)
    assert set(rep["presets"]) == {"h100x8", "h200x8"}
    # H200 has more HBM bandwidth than H100: its preset charges less per lookup unit
    assert (
        rep["presets"]["h200x8"]["lookup_fwd"]["b_s"]
        < rep["presets"]["h100x8"]["lookup_fwd"]["b_s"]
    )
    fused = rep["runs"]["fused"]
    cal = json.loads((profiles["row_wise"] / "calibration.json").read_text())
    for kind in ("lookup_fwd", "lookup_bwd"):
        assert fused["lookup"][kind]["b_s"] == cal["ops"][kind]["b_s"]
        ratio = fused["vs_presets"]["h100x8"][kind]
        assert ratio == pytest.approx(
            cal["ops"][kind]["b_s"] / rep["presets"]["h100x8"][kind]["b_s"]
        )
    assert fused["kernel_stages"]["cuda"] is False  # CPU traces: no GPU kernels to match
    assert "uvm" not in fused
    small, big = rep["runs"]["uvm_small"]["uvm"], rep["runs"]["uvm_big"]["uvm"]
    extra = _window_median(profiles["table_wise"]) - _window_median(profiles["row_wise"])
    assert small["extra_step_s"] == pytest.approx(extra)
    # a bigger cache misses fewer elements, and never more than every element looked up
    tables, batch = stats_from_profile(b)
    looked_up = sum(t.ids_per_sample * batch * t.embedding_dim for t in tables)
    assert 0 < big["miss_elements_per_step"] < small["miss_elements_per_step"] < looked_up
    assert small["miss_b_s"] == pytest.approx(extra / (2 * small["miss_elements_per_step"]))
    text = gpu_check.summary_text(rep)
    assert "uvm_small [stand-in]" in text and "h200x8" in text


def test_a_cache_holding_every_row_misses_nothing(profiles):
    b = str(profiles["table_wise"])
    assert gpu_check.miss_elements(b, 1.0) == 0
    rep = gpu_check.report(
        [
            gpu_check.Run("fused", b),
            gpu_check.Run("all", b, "fused_uvm_caching", 1.0, baseline="fused"),
        ]
    )
    assert rep["runs"]["all"]["uvm"]["miss_b_s"] is None  # no misses: nothing to divide by


def test_report_refuses_an_unknown_baseline_and_an_unanalyzed_profile(profiles, tmp_path):
    a = str(profiles["row_wise"])
    with pytest.raises(UserError, match="baseline 'nope'"):
        gpu_check.report([gpu_check.Run("u", a, "fused_uvm_caching", 0.1, baseline="nope")])
    bare = tmp_path / "bare"
    shutil.copytree(FIX / "profile_tiny_row_wise", bare)
    with pytest.raises(UserError, match="calibration.json"):
        gpu_check.report([gpu_check.Run("x", str(bare))])


def test_kernel_stages_match_gpu_kernels_to_the_stage_that_launched_them(profiles, monkeypatch):
    from sparselift.analysis import profile as profile_mod

    real = profile_mod.load_profile
    d = profiles["row_wise"]
    nodes = analyze(d).nodes
    fwd = nodes[(nodes["rank"] == 0) & (nodes["kind"] == "lookup_fwd")].iloc[0]
    pid, tid = str(fwd["thread"]).split("/")
    mid = (fwd["start_us"] + fwd["end_us"]) / 2

    def with_kernels(path, cache=True, progress=None):
        prof = real(path, cache=cache, progress=progress)
        ev = prof.traces[0].events
        extra = pd.DataFrame(
            {
                "name": ["cudaLaunchKernel", "some_tbe_kernel", "lru_cache_insert_kernel"],
                "cat": ["cuda_runtime", "kernel", "kernel"],
                "pid": [ev["pid"].iloc[0].__class__(pid), 0, 0],
                "tid": [ev["tid"].iloc[0].__class__(tid), 7, 7],
                "ts": [mid, mid + 5, mid + 50],
                "dur": [1.0, 200.0, 100.0],
                "correlation": [42, 42, 999],
            }
        )
        prof.traces[0].events = pd.concat([ev, extra], ignore_index=True)
        return prof

    monkeypatch.setattr(profile_mod, "load_profile", with_kernels)
    ks = gpu_check.kernel_stages(d)
    assert ks["cuda"] and ks["kernels"] == 2
    assert ks["by_kind"]["lookup_fwd"]["via"] == {"launch": 1}  # by its launch, not its name
    assert ks["by_kind"]["uvm_cache"]["via"] == {"name": 1}  # no launch found: by its name
    assert ks["matched_share"] == pytest.approx(200 / 300)
    rank_steps = len(analyze(d).steps)
    fwd_dev = ks["by_kind"]["lookup_fwd"]
    assert fwd_dev["gpu_s_per_step"] == pytest.approx(200e-6 / rank_steps)
    assert fwd_dev["gpu_s_per_unit"] > 0 and "gpu_s_per_unit" not in ks["by_kind"]["uvm_cache"]


def test_write_plan_sets_kernels_and_refuses_what_the_plan_checks_refuse(tmp_path, cli):
    cuda, cpu = tmp_path / "cuda.json", tmp_path / "cpu.json"
    for dev, p in (("cuda", cuda), ("cpu", cpu)):
        code, _, err = cli(
            "plan",
            "round-robin",
            "--workload",
            "tiny",
            "--world-size",
            "1",
            "--device",
            dev,
            "--out",
            p,
        )
        assert code == 0, err
    out = tmp_path / "uvm.json"
    gpu_check.write_plan(cuda, out, "fused_uvm_caching", 0.25)
    tables = json.loads(out.read_text())["tables"]
    assert {(t["compute_kernel"], t["cache_load_factor"]) for t in tables} == {
        ("fused_uvm_caching", 0.25)
    }
    bad = tmp_path / "bad.json"
    assert (
        gpu_check.main(["plan", str(cpu), str(bad), "--kernel", "fused_uvm_caching", "--lf", "0.1"])
        == 2
    )  # CPU has no UVM caching
    assert (
        gpu_check.main(
            ["plan", str(cuda), str(bad), "--kernel", "fused_uvm_caching", "--lf", "1.5"]
        )
        == 2
    )
    assert not bad.exists() and not list(tmp_path.glob("*.check.json"))


def test_parse_run_reads_options_and_refuses_unknown_ones():
    r = gpu_check.parse_run("u=/p,kernel=fused_uvm_caching,lf=0.5,baseline=f,stand_in=1")
    assert (r.name, r.profile, r.cache_load_factor, r.baseline, r.stand_in) == (
        "u",
        "/p",
        0.5,
        "f",
        True,
    )
    with pytest.raises(UserError, match="unknown option"):
        gpu_check.parse_run("u=/p,colour=red")
    with pytest.raises(UserError, match="NAME=DIR"):
        gpu_check.parse_run("/p")


@pytest.mark.slow
def test_dry_run_runs_every_step_but_the_gpu_ones(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "OUT": str(out)}
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "gpu_check.json").read_text())
    assert set(rep["runs"]) == {"tiny_fused", "mh26_fused", "mh26_uvm_0.1", "mh26_uvm_0.5"}
    for name, run in rep["runs"].items():
        assert run["device"] == "cpu"
        assert {"lookup_fwd", "lookup_bwd"} <= set(run["lookup"]), name
        assert run["step_s"] > 0
    assert rep["runs"]["mh26_uvm_0.1"]["stand_in"] and "uvm" in rep["runs"]["mh26_uvm_0.1"]
    # the CUDA plans a GPU run would profile were written and passed the plan checks
    uvm = json.loads((out / "plans" / "cuda" / "mh26_uvm_0.5.json").read_text())
    assert uvm["topology"]["device"] == "cuda"
    assert {t["cache_load_factor"] for t in uvm["tables"]} == {0.5}
    assert "mh26_uvm_0.5 [stand-in]" in (out / "gpu_check.txt").read_text()
    # without --dry-run, a host with no GPU is one line and a non-zero exit
    if shutil.which("nvidia-smi") is None:
        r = subprocess.run(
            [str(ROOT / "scripts" / "gpu_check.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and r.stderr.strip().splitlines() == [
            "gpu_check: no GPU: nvidia-smi lists none "
            "(scripts/gpu_check.sh --dry-run checks on CPU)"
        ]


@pytest.mark.slow
def test_missing_wheels_are_one_line_before_anything_runs(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    env = {**os.environ, "OUT": str(tmp_path / "o")}
    r = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--wheels", str(tmp_path / "w")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        f"gpu_check: no CUDA torch 2.13.0 wheel (torch-2.13.0*.whl, not +cpu) in {tmp_path / 'w'}"
    ]
    assert not (tmp_path / "o" / "plans" / "cuda").exists()
