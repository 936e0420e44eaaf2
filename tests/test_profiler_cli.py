"""`sparselift profile` end to end on 2 ranks: every file of the profile directory, and refusals."""

from __future__ import annotations

import gzip
import json
import os
import re

import pandas as pd
import pytest

from sparselift.cli import main
from sparselift.profile_manifest import shared_cores

STEPS, WARMUP, STEADY = 3, 2, 4


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny"
    rc = main(
        [
            "profile",
            "--workload",
            "tiny",
            "--nproc",
            "2",
            "--steps",
            str(STEPS),
            "--warmup",
            str(WARMUP),
            "--after",
            "3",
            "--steady-steps",
            str(STEADY),
            "--execution-trace",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return out


@pytest.mark.slow
def test_every_file_is_there(profile_dir):
    names = sorted(p.name for p in profile_dir.iterdir())
    assert names == [
        "access_stats.parquet",
        "hot_ids.parquet",
        "manifest.json",
        "rank0.et.json",
        "rank0.trace.json.gz",
        "rank1.et.json",
        "rank1.trace.json.gz",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_trace_holds_the_sparse_path(profile_dir, rank):
    trace = json.loads(gzip.open(profile_dir / f"rank{rank}.trace.json.gz").read())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    steps = sorted(int(n.split("#")[1]) for n in names if n.startswith("ProfilerStep#"))
    assert steps == list(range(WARMUP, WARMUP + STEPS))
    for pattern in (
        r"^\[splits_dist\]_\[",
        r"^## all2all_data:kjt lengths ##$",
        r"^\[lookup\]_\[",
        r"^\[output_dist\]_\[",
        r"^## All2All_Pooled_fwd ##$",
        r"^## All2All_Pooled_bwd ##$",
        r"^fbgemm::split_embedding_codegen_forward",
        r"^c10d::alltoall_base_$",
    ):
        assert any(re.search(pattern, n) for n in names), pattern
    shaped = [
        e
        for e in trace["traceEvents"]
        if e.get("name", "").startswith("fbgemm::") and e.get("args", {}).get("Input Dims")
    ]
    assert shaped, "record_shapes: fbgemm ops carry input shapes"
    et = json.loads((profile_dir / f"rank{rank}.et.json").read_text())
    assert et["nodes"]


@pytest.mark.slow
def test_manifest(profile_dir):
    m = json.loads((profile_dir / "manifest.json").read_text())
    assert (m["format"], m["version"]) == ("sparselift-profile", 1)
    assert set(m["versions"]) >= {"sparselift", "torch", "torchrec", "fbgemm_gpu"}
    assert m["command"][:2] == ["sparselift", "profile"] and m["workload"] == "tiny"
    assert (m["world_size"], m["local_world_size"], m["device"], m["backend"]) == (
        2,
        2,
        "cpu",
        "gloo",
    )
    assert m["batch_size"] == 256 and m["pipeline"] == "TrainPipelineBase"
    assert m["warmup"] == WARMUP and m["profiled_steps"] == [2, 3, 4]
    assert len(m["tables"]) == 8
    t2 = next(t for t in m["tables"] if t["name"] == "t2")
    assert (t2["num_embeddings"], t2["embedding_dim"], t2["feature_names"], t2["pooling"]) == (
        20000,
        32,
        ["t2"],
        "poisson",
    )
    assert (
        t2["pooling_factor"] == 4
        and t2["zipf_alpha"] == 1.2
        and isinstance(t2["zipf_alpha_fitted"], float)
    )
    assert sorted(s["table"] for s in m["sharding"]) == [f"t{i}" for i in range(8)]
    for s in m["sharding"]:
        assert s["sharding_type"] and s["compute_kernel"] and s["ranks"]
        assert sum(sh["sizes"][0] * sh["sizes"][1] for sh in s["shards"]) == next(
            t["num_embeddings"] * t["embedding_dim"] for t in m["tables"] if t["name"] == s["table"]
        )
    # the run trains max(--after, --steady-steps) steps after the window
    assert [len(t) for t in m["step_times_s"]] == [WARMUP + STEPS + STEADY] * 2
    slowest = [max(t[i] for t in m["step_times_s"]) for i in range(WARMUP + STEPS + STEADY)]
    assert m["steady_step_s"] == slowest[WARMUP + STEPS :]
    assert all(0 < t < 10 for t in m["steady_step_s"])
    # each rank's embedding kernels timed in every profiled and every steady step, within it
    assert [(len(r["window"]), len(r["steady"])) for r in m["lookup_s"]] == [(STEPS, STEADY)] * 2
    for r, rec in enumerate(m["lookup_s"]):
        timed = rec["window"] + rec["steady"]
        for (fwd, bwd), step in zip(timed, m["step_times_s"][r][WARMUP:], strict=True):
            assert 0 < fwd < step and 0 < bwd < step
    assert len(m["peak_memory_bytes"]) == 2 and all(b > 0 for b in m["peak_memory_bytes"])
    assert m["host_cores"] == [len(os.sched_getaffinity(0))] * 2  # the ranks inherit ours
    assert (
        m["files"]["traces"] == ["rank0.trace.json.gz", "rank1.trace.json.gz"] and m["errors"] == []
    )


@pytest.mark.slow
def test_access_stats(profile_dir):
    df = pd.read_parquet(profile_dir / "access_stats.parquet")
    assert list(df.columns) == [
        "table",
        "rank",
        "step",
        "num_embeddings",
        "embedding_dim",
        "batch_size",
        "ids",
        "unique_ids",
        "pooling_mean",
        "pooling_p50",
        "pooling_p99",
        "pooling_max",
        "top1pct_share",
        "top10pct_share",
        "id_bytes",
        "zipf_alpha",
    ]
    assert len(df) == 8 * 2 * STEPS
    assert set(df["rank"]) == {0, 1} and set(df["step"]) == {2, 3, 4}
    assert (df["unique_ids"] <= df["ids"]).all() and (df["id_bytes"] == 8 * df["ids"]).all()
    assert (df.groupby("table")["zipf_alpha"].nunique() == 1).all()


@pytest.mark.slow
def test_non_empty_dir_refused_without_force(profile_dir, capsys):
    rc = main(["profile", "--workload", "tiny", "--nproc", "2", "--out", str(profile_dir)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(profile_dir) in err and "--force" in err


def test_unwritable_out_refused(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["profile", "--workload", "tiny", "--nproc", "2", "--out", str(blocker / "prof")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and str(blocker / "prof") in err and len(err.splitlines()) == 1


@pytest.mark.slow
def test_force_replaces_a_profile(tmp_path):
    out = tmp_path / "p"
    out.mkdir()
    (out / "rank7.trace.json.gz").write_bytes(b"stale")
    rc = main(
        [
            "profile",
            "--workload",
            "tiny",
            "--nproc",
            "2",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--after",
            "0",
            "--steady-steps",
            "0",
            "--force",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "access_stats.parquet",
        "hot_ids.parquet",
        "manifest.json",
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
    ]
    m = json.loads((out / "manifest.json").read_text())
    assert m["steady_step_s"] == [] and [len(t) for t in m["step_times_s"]] == [2, 2]


def test_negative_steady_steps_refused(tmp_path, capsys):
    rc = main(
        ["profile", "--workload", "tiny", "--steady-steps", "-1", "--out", str(tmp_path / "p")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--steady-steps" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_the_manifest_records_the_collectives_precision_in_force(tmp_path, profile_dir):
    assert json.loads((profile_dir / "manifest.json").read_text())["comm_precision"] == {
        "forward": "fp32",
        "backward": "fp32",
    }
    plan = tmp_path / "rr.json"
    rr = ["plan", "round-robin", "--workload", "tiny", "--world-size", "2", "--out", str(plan)]
    assert main(rr) == 0
    doc = json.loads(plan.read_text())
    doc["comm_precision"] = {"forward": "fp16", "backward": "fp16"}
    plan.write_text(json.dumps(doc))
    out = tmp_path / "p"
    argv = ["profile", "--workload", "tiny", "--nproc", "2", "--steps", "1", "--warmup", "1"]
    assert (
        main([*argv, "--after", "0", "--steady-steps", "0", "--plan", str(plan), "--out", str(out)])
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["comm_precision"] == {"forward": "fp16", "backward": "fp16"}


@pytest.mark.slow
def test_ranks_that_share_cores_are_warned_of(profile_dir, tmp_path):
    m = json.loads((profile_dir / "manifest.json").read_text())
    assert (shared_cores([profile_dir]) is None) == (len(os.sched_getaffinity(0)) >= 2)
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / "manifest.json").write_text(json.dumps({**m, "host_cores": [1, 1]}))
    warning = shared_cores([profile_dir, crowded])
    assert warning is not None and warning.startswith(f"warning: {crowded}: 2 ranks shared 1 ")
    assert f"host {m['hosts'][0]!r}" in warning
    # one host: cores per rank; two hosts of one rank each have a core each
    (crowded / "manifest.json").write_text(
        json.dumps({**m, "hosts": ["a", "b"], "host_cores": [1, 1]})
    )
    assert shared_cores([crowded]) is None
