"""The harness trains real DMP models on 2 gloo ranks, reports honestly, and fails fast."""

from __future__ import annotations

import errno
import json
import socket
import time

import numpy as np
import pytest
from test_workloads_models_data import write_criteo_day

from sparselift.workloads import load_workload
from sparselift.workloads.batches import SyntheticBatches
from sparselift.workloads.harness import TrainConfig, run_training
from sparselift.workloads.launch import RankFailed, error_files, failure_error
from sparselift.workloads.rank import batches_for_rank, made_ahead


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["base", "sparse-dist"])
def test_train_cli_writes_json(cli, tmp_path, pipeline):
    out = tmp_path / "out.json"
    code, stdout, err = cli(
        "train",
        "--workload",
        "tiny",
        "--nproc",
        "2",
        "--steps",
        "4",
        "--warmup",
        "2",
        "--pipeline",
        pipeline,
        "--json",
        out,
    )
    assert code == 0, err
    r = json.loads(out.read_text())
    assert r["world_size"] == 2 and r["pipeline"] == pipeline and r["backend"] == "gloo"
    assert r["steps_per_s"] > 0 and r["samples_per_s"] == pytest.approx(r["steps_per_s"] * 256 * 2)
    assert all(len(rank["step_times_s"]) == 6 for rank in r["ranks"])
    assert all(m > 50 * 2**20 for m in r["peak_memory_bytes"])
    assert "steps/s" in stdout and "samples/s" in stdout


@pytest.mark.slow
def test_default_plan_is_torchrecs_planner():
    r = run_training(
        TrainConfig(workload="tiny", nproc=2, steps=1, warmup=0, hook="rank_hooks:ShardingTypes")
    )
    tables = r.ranks[0].extra["tables"]
    assert set(tables) == {f"t{i}" for i in range(8)}
    assert {t["sharding_type"] for t in tables.values()} <= {
        "data_parallel",
        "table_wise",
        "column_wise",
        "table_column_wise",
    }
    assert r.ranks[0].extra == r.ranks[1].extra  # one collective plan for all ranks


@pytest.mark.slow
def test_a_crashing_rank_stops_the_job_with_its_error(cli):
    t0 = time.monotonic()
    with pytest.raises(RankFailed, match="rank 1 failed: RuntimeError: injected failure on rank 1"):
        run_training(
            TrainConfig(workload="tiny", nproc=2, steps=50, warmup=0, hook="rank_hooks:CrashOnRank")
        )
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_error_files_torchelastic_could_not_read_are_read_after_the_job(tmp_path):
    # torchelastic's layout: <log_dir>/<run>_<x>/attempt_0/<rank>/error.json; rank 0's was
    # still empty when torchelastic read it, rank 1's holds its error
    attempt = tmp_path / "sparselift-abc_x1" / "attempt_0"
    for rank, text in ((0, ""), (1, "RuntimeError: injected failure on rank 1")):
        (attempt / str(rank)).mkdir(parents=True)
        doc = json.dumps({"message": {"message": text}}) if text else ""
        (attempt / str(rank) / "error.json").write_text(doc)
    err = failure_error(error_files(str(tmp_path)))
    assert isinstance(err, RankFailed)
    assert str(err) == (
        "rank 0 failed: no readable error recorded; "
        "rank 1 failed: RuntimeError: injected failure on rank 1"
    )
    assert error_files(str(tmp_path / "empty")) == [
        (-1, "a rank failed and left no readable error")
    ]


def test_busy_default_port_is_not_an_error():
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", 29500))
            s.listen()
        except OSError as e:
            if e.errno != errno.EADDRINUSE:  # only "someone else holds it" is just as good
                raise
        r = run_training(TrainConfig(workload="tiny", nproc=2, steps=1, warmup=0))
    assert r.world_size == 2 and all(len(x.step_times_s) == 1 for x in r.ranks)


def test_batches_are_made_before_the_steps_and_the_stream_is_unchanged():
    spec = load_workload("tiny")
    made = []

    def counted():
        for b in SyntheticBatches(spec, seed=3):
            made.append(b)
            yield b

    it = made_ahead(counted(), 5)
    assert len(made) == 5  # before the first step asks for one
    got = [next(it) for _ in range(7)]
    assert len(made) == 7 and all(g is m for g, m in zip(got, made, strict=True))
    ref = SyntheticBatches(spec, seed=3)
    for g in got:
        assert g.sparse_features.values().equal(ref.next_batch().sparse_features.values())
    # a memory budget stops making ahead after the batch that reaches it
    made.clear()
    made_ahead(counted(), 5, budget=1)
    assert len(made) == 1


@pytest.mark.slow
def test_train_on_criteo_day_files(tmp_path):
    write_criteo_day(tmp_path, 0, 512)
    cfg = TrainConfig(
        workload="criteo-kaggle",
        nproc=2,
        steps=3,
        warmup=1,
        max_rows=1000,
        batch_size=64,
        data=str(tmp_path),
    )
    r = run_training(cfg)
    assert r.world_size == 2 and all(len(x.step_times_s) == 4 for x in r.ranks)
    # what each rank trains on: its share of the day's rows, ids inside every (capped) table
    spec = cfg.validate()
    raw = np.load(tmp_path / "day_0_dense.npy")
    for rank in (0, 1):
        b = next(batches_for_rank(cfg, spec, rank, 2))
        np.testing.assert_array_equal(b.dense_features.numpy(), raw[64 * rank : 64 * (rank + 1)])
        for t in spec.capped(1000).tables:
            assert int(b.sparse_features[t.name].values().max()) < t.num_embeddings
