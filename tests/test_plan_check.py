"""`sparselift plan check`: a plan's statistics digest against a new profile, the plan priced under
it, what re-planning gains, and the verdict's exit code; refusals as one line, exit 2.

Plans are made by `sparselift optimize` from the real fixture profile (analyzed once); drifted
profiles are that profile with one table's measured ids scaled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from bad_input_cases import analyzed_fixture_profile

from sparselift import plans
from sparselift.calibration import read_checked
from sparselift.cli import main
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.planio import statistics_digest
from sparselift.optimizer.predict import predict_plan
from sparselift.optimizer.recheck import DRIFT_TOLERANCE, recheck, topology_of
from sparselift.optimizer.table_stats import stats_from_profile
from sparselift.plans.render import diff


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """(an analyzed fixture profile, the plan `optimize` made from it)."""
    root = tmp_path_factory.mktemp("plan_check")
    prof = analyzed_fixture_profile(root)
    plan = root / "plan.json"
    args = ["--profile", str(prof), "--out", str(plan), "--time-limit", "5", "--no-baseline"]
    assert main(["optimize", *args]) == 0
    return prof, plan


def _variant(prof: Path, dst: Path, table: str, ids_factor: float = 1.0, rename: str = "") -> Path:
    """A copy of `prof` whose `table` looks up `ids_factor` times the ids, or is named `rename`."""
    shutil.copytree(prof, dst)
    df = pd.read_parquet(prof / "access_stats.parquet")
    m = df["table"] == table
    for col in ("ids", "pooling_mean"):
        df[col] = df[col].astype(float)
        df.loc[m, col] *= ids_factor
    if rename:
        df.loc[m, "table"] = rename
    df.to_parquet(dst / "access_stats.parquet")
    return dst


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_the_optimizer_records_the_digest_it_planned_with_deterministically(made, tmp_path, capsys):
    prof, path = made
    plan = plans.load(path)
    stats, batch = stats_from_profile(prof)
    assert plan.statistics == statistics_digest(stats, batch)
    by_name = {s.name: s for s in stats}
    for name, v in plan.statistics.items():
        s = by_name[name]
        assert v["ids_per_step"] == pytest.approx(s.ids_per_sample * batch, rel=1e-5)
        assert v["pooling"] == pytest.approx(s.ids_per_sample / len(s.feature_names), rel=1e-5)
        assert 0 < v["unique_ratio"] <= 1 and 0 < v["hot_share"] <= 1
    again = tmp_path / "again.json"
    args = ["--profile", str(prof), "--out", str(again), "--time-limit", "5", "--no-baseline"]
    assert main(["optimize", *args]) == 0
    assert again.read_bytes() == path.read_bytes()
    capsys.readouterr()
    assert main(["plan", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "statistics digest (8 tables" in out
    t7 = plan.statistics["t7"]
    assert any(
        line.split()[:2] == ["t7", f"{t7['ids_per_step']:,.0f}"] for line in out.splitlines()
    )


def test_same_statistics_no_drift_same_prediction_exit_0(made, cli):
    prof, path = made
    code, out, err = cli("plan", "check", str(path), "--profile", str(prof))
    assert code == 0, err
    assert f"drift over {DRIFT_TOLERANCE:.0%} (relative change of a digest field): none" in out
    res = recheck(plans.load(path), prof)
    recorded = plans.load(path).predicted["step_time_s"]
    assert res.predicted.step_time_s == pytest.approx(recorded, rel=1e-9)  # priced as optimize did
    assert res.gain < res.threshold and not res.drifts
    assert out.strip().splitlines()[-1].startswith("verdict: still right")


def test_a_drifted_table_is_flagged_and_replanning_it_gains_exit_1(made, tmp_path, cli):
    prof, path = made
    drifted = _variant(prof, tmp_path / "drifted", "t7", ids_factor=5.0)
    plan = plans.load(path)
    res = recheck(plan, drifted)
    assert {d.table for d in res.drifts} == {"t7"}
    fields = {d.field: d for d in res.drifts}
    assert {"ids_per_step", "pooling"} <= set(fields)
    for f in ("ids_per_step", "pooling"):
        assert fields[f].profile_value == pytest.approx(5 * plan.statistics["t7"][f], rel=1e-4)
        assert fields[f].change == pytest.approx(4.0, rel=1e-4)
    # the numbers are the cost model's: the plan and the re-planned plan priced independently
    stats, batch = stats_from_profile(drifted)
    topo = topology_of(plan)
    coeffs = coefficients(topo, read_checked(drifted / "calibration.json"))
    before = predict_plan(plan, stats, coeffs, topo, batch).step_time_s
    after = predict_plan(res.replanned.plan, stats, coeffs, topo, batch).step_time_s
    assert res.predicted.step_time_s == pytest.approx(before, rel=1e-9)
    assert res.replanned.cost.step_time_s == pytest.approx(after, rel=1e-9)
    assert res.gain == pytest.approx((before - after) / before, rel=1e-9)
    assert res.gain > 0.05  # t7 on one rank, five times heavier: worth re-sharding
    assert diff(plan, res.replanned.plan)  # and the re-plan does shard otherwise

    before_tree = _tree(tmp_path)
    code, out, err = cli("plan", "check", str(path), "--profile", str(drifted))
    assert code == 1, err
    lines = out.strip().splitlines()
    row = next(line.split() for line in lines if line.split()[:2] == ["t7", "pooling"])
    assert row[4] == "+400%"
    assert f"predicted step: {before * 1e3:.3f} ms" in out
    assert f"re-planned step: {after * 1e3:.3f} ms ({res.gain:.1%} faster" in out
    assert lines[-1].startswith("verdict: stale")
    assert _tree(tmp_path) == before_tree  # nothing written
    # a threshold above the gain: the same drift, but not worth a new plan
    code, out, _ = cli(
        "plan", "check", str(path), "--profile", str(drifted), "--threshold", f"{res.gain + 0.01}"
    )
    assert code == 0 and out.strip().splitlines()[-1].startswith("verdict: still right")


def test_another_models_profile_is_refused_naming_the_tables(made, tmp_path, cli):
    prof, path = made
    other = _variant(prof, tmp_path / "other", "t3", rename="clicks")
    code, out, err = cli("plan", "check", str(path), "--profile", str(other))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "another model" in lines[0]
    assert "missing from the profile: t3" in lines[0] and "not in the plan: clicks" in lines[0]
    resized = tmp_path / "resized"  # the same names, another row cap
    shutil.copytree(prof, resized)
    df = pd.read_parquet(prof / "access_stats.parquet")
    df.loc[df["table"] == "t5", "num_embeddings"] = 777
    df.to_parquet(resized / "access_stats.parquet")
    code, _, err = cli("plan", "check", str(path), "--profile", str(resized))
    assert code == 2 and err.count("\n") == 1
    assert "sized otherwise" in err and "t5 (50000x32 in the plan, 777x32 profiled)" in err
    retyped = tmp_path / "retyped"  # the same tables, one of fp16 weights now
    shutil.copytree(prof, retyped)
    manifest = json.loads((prof / "manifest.json").read_text())
    next(t for t in manifest["tables"] if t["name"] == "t2")["data_type"] = "fp16"
    (retyped / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli("plan", "check", str(path), "--profile", str(retyped))
    assert code == 2 and err.count("\n") == 1
    assert "weights are of another type" in err and "t2 (fp32 in the plan, fp16 profiled)" in err


def test_a_plan_without_a_digest_is_priced_and_replanned_its_drift_not_checked(made, tmp_path, cli):
    prof, path = made
    d = json.loads(path.read_text())
    del d["statistics"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(d))
    assert plans.load(old).statistics is None  # older plans still load
    code, out, err = cli("plan", "check", str(old), "--profile", str(prof))
    assert code == 0, err
    assert "statistics drift: not checked: the plan records no statistics digest" in out
    with_digest = cli("plan", "check", str(path), "--profile", str(prof))[1]
    # the same plan, priced and re-planned alike: only the drift line differs
    assert out.splitlines()[2:] == with_digest.splitlines()[2:]
    # a round-robin plan of the same tables (TorchRec's and round-robin plans have no digest)
    rr = tmp_path / "rr.json"
    spec = ["--workload", "tiny", "--world-size", "2", "--device", "cpu"]
    assert main(["plan", "round-robin", *spec, "--out", str(rr)]) == 0
    code, out, err = cli("plan", "check", str(rr), "--profile", str(prof))
    assert code in (0, 1) and "re-planned step" in out and "verdict: " in out, err


@pytest.mark.parametrize(
    "case", ["plan-missing", "no-manifest", "threshold-zero", "threshold-nan", "text"]
)
def test_bad_input_one_line_exit_2(made, tmp_path, cli, case):
    prof, path = made
    args = [str(path), "--profile", str(prof)]
    if case == "plan-missing":
        args[0], want = str(tmp_path / "nope.json"), "nope.json"
    elif case == "no-manifest":
        bare = tmp_path / "bare"
        bare.mkdir()
        shutil.copy(prof / "access_stats.parquet", bare)
        args[2], want = str(bare), "manifest.json: missing"
    elif case == "text":
        args, want = [*args, "--threshold", "five"], "--threshold"
    else:
        value = "0" if case == "threshold-zero" else "nan"
        args, want = [*args, "--threshold", value], "--threshold"
    before = _tree(tmp_path)
    code, out, err = cli("plan", "check", *args)
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and want in err and "Traceback" not in err
    assert _tree(tmp_path) == before


def test_a_bad_digest_value_is_refused_naming_the_file_and_table(made, tmp_path, cli):
    _, path = made
    d = json.loads(path.read_text())
    d["statistics"]["t2"]["unique_ratio"] = 1.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    code, _, err = cli("plan", "show", str(bad))
    assert code == 2 and err.count("\n") == 1
    assert str(bad) in err and "statistics.t2.unique_ratio" in err
    d["statistics"]["t2"]["unique_ratio"] = float("nan")  # JSON readers take NaN: refused too
    bad.write_text(json.dumps(d))
    with pytest.raises(plans.PlanError, match=r"statistics\.t2\.unique_ratio: nan"):
        plans.load(bad)
    d["statistics"]["t2"]["unique_ratio"] = 0.5
    d["statistics"]["nope"] = d["statistics"].pop("t2")
    bad.write_text(json.dumps(d))
    with pytest.raises(plans.PlanError, match="statistics.nope: no such table") as e:
        plans.load(bad)
    assert "no entry for table 't2'" in str(e.value)


def test_a_kept_profiled_plan_names_its_preset_and_is_kept_only_for_its_ranks(made, tmp_path, cli):
    prof, _ = made
    kept = tmp_path / "kept.json"
    args = ["--profile", str(prof), "--time-limit", "5", "--no-baseline"]
    code, out, err = cli("optimize", *args, "--min-gain", "10", "--out", str(kept))
    assert code == 0 and "kept the profiled plan" in out, out + err
    # compared with the profiled plan, and named so: TorchRec's planner did not run
    assert [x.split()[:2] for x in out.splitlines() if "predicted speedup" in x] == [
        ["profiled", "plan"]
    ]
    assert plans.load(kept).topology.preset == "cpu-gloo"
    code, out, err = cli("plan", "check", str(kept), "--profile", str(prof))
    assert code in (0, 1) and "(the plan recorded " in out, out + err  # priced, not refused
    doc = json.loads(kept.read_text())  # as kept before plans named it: CPU has one preset
    kept.write_text(json.dumps({**doc, "topology": {**doc["topology"], "preset": None}}))
    assert cli("plan", "check", str(kept), "--profile", str(prof))[0] == code
    wider = tmp_path / "wider.json"
    code, out, err = cli(
        "optimize", *args, "--min-gain", "10", "--world-size", "3", "--out", str(wider)
    )
    assert code == 0 and "the profiled plan is for 2 cpu ranks, 2 a host, not the 3" in out, out
    assert plans.load(wider).topology.world_size == 3
