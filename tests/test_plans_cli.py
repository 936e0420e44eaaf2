"""`sparselift plan …`: views, exports, and every refusal as one line with exit code 2."""

from __future__ import annotations

import dataclasses

import pytest
from plans_helpers import doc, mixed, round_robin, write

from sparselift import plans
from sparselift.cli import main
from sparselift.plans.types import CommPrecision


@pytest.fixture
def rr(tmp_path):
    path = tmp_path / "rr.json"
    plans.save(round_robin(2), path)
    return path


def test_show_has_table_and_rank_views(tmp_path, capsys):
    path = tmp_path / "m.json"
    plans.save(mixed(), path)
    assert main(["plan", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 ranks (2 per host), cpu" in out and "per table" in out and "per rank" in out
    assert " ".join(
        "t2 20,000 32 RW fused r0:rows 0-10000, r1:rows 10000-20000".split()
    ) in " ".join(out.split())
    assert "t0" in out and "whole table on every rank" in out
    assert "predicted step time 12.35 ms" in out


def test_diff(tmp_path, rr, capsys):
    m = tmp_path / "m.json"
    plans.save(mixed(), m)
    assert main(["plan", "diff", str(rr), str(rr)]) == 0
    assert "identically" in capsys.readouterr().out
    assert main(["plan", "diff", str(rr), str(m)]) == 0
    out = capsys.readouterr().out
    assert "table t0: table_wise -> data_parallel; kernel fused -> dense" in out
    assert "table t3: table_wise -> column_wise; rank 1 -> r1:cols 0-16, r0:cols 16-32" in out
    # plan-wide fields, one line each, by name
    base = mixed()
    other = dataclasses.replace(
        base,
        topology=dataclasses.replace(base.topology, preset="h100x8"),
        comm_precision=CommPrecision("fp16", base.comm_precision.backward),
    )
    plans.save(other, m)
    plans.save(base, tmp_path / "m0.json")
    assert main(["plan", "diff", str(tmp_path / "m0.json"), str(m)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"topology: preset {base.topology.preset} -> h100x8" in lines
    assert f"comm_precision: forward {base.comm_precision.forward} -> fp16" in lines


def test_round_robin_and_from_torchrec_write_valid_plans(tmp_path, capsys):
    out = tmp_path / "rr.json"
    assert (
        main(["plan", "round-robin", "--workload", "tiny", "--world-size", "3", "--out", str(out)])
        == 0
    )
    p = plans.load(out)
    assert [t.ranks for t in p.tables] == [[i % 3] for i in range(8)]
    assert p.module == "model.sparse_arch.embedding_bag_collection" and p.pipeline == "base"

    out = tmp_path / "tr.json"
    assert (
        main(
            [
                "plan",
                "from-torchrec",
                "--workload",
                "criteo-kaggle",
                "--max-rows",
                "100000",
                "--world-size",
                "4",
                "--local-world-size",
                "2",
                "--device",
                "cuda",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    p = plans.load(out)
    assert (p.topology.world_size, p.topology.local_world_size, p.topology.device) == (4, 2, "cuda")
    assert len(p.tables) == 26 and p.provenance["workload"] == "criteo-kaggle"
    assert (
        main(["plan", "validate", str(out), "--workload", "criteo-kaggle", "--max-rows", "100000"])
        == 0
    )
    assert "valid plan, 26 tables on 4 ranks, fits criteo-kaggle" in capsys.readouterr().out


def _refusals(tmp_path, rr):
    good = doc(round_robin(2))
    cases = {"malformed": ('{"format": "sparselift-plan", "version": 1, ', "malformed JSON")}
    d = doc(round_robin(2))
    d["tables"][0]["compute_kernel"] = "magic"
    cases["schema"] = (d, "tables[0] ('t0').compute_kernel: 'magic' is not one of")
    d = doc(round_robin(2))
    d["version"] = 9
    cases["newer"] = (d, "version 9 is newer")
    d = doc(round_robin(2))
    d["tables"][3]["ranks"] = [2]
    d["tables"][3]["shards"][0]["rank"] = 2
    cases["rank-range"] = (
        d,
        "table 't3': rank 2 is out of range for world_size 2; "
        "table 't3': shard rank 2 is out of range for world_size 2",
    )
    d = doc(round_robin(2))
    d["tables"][3]["shards"][0]["sizes"] = [99999, 32]
    cases["not-covering"] = (
        d,
        "table 't3': table_wise needs one shard of the whole table (100000 × 32)",
    )
    return good, cases


@pytest.mark.parametrize("case", ["malformed", "schema", "newer", "rank-range", "not-covering"])
def test_bad_files_are_refused_with_exit_2(tmp_path, rr, capsys, case):
    _, cases = _refusals(tmp_path, rr)
    content, expected = cases[case]
    path = write(tmp_path / f"{case}.json", content)
    for argv in (
        ["plan", "validate", str(path)],
        ["plan", "show", str(path)],
        ["plan", "diff", str(rr), str(path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert err.startswith(f"sparselift plan {argv[1]}: error: {path}: "), err
        assert expected in err


def test_plan_for_another_model_or_world_is_refused(rr, capsys):
    assert main(["plan", "validate", str(rr), "--workload", "criteo-kaggle"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sparselift plan validate: error: {rr}: ")
    # no table in common: one problem for the whole model, not one per table
    assert err.count("\n") == 1 and err.count("table") == 2, err
    assert (
        "the plan is for another model: none of its 8 tables ('t0', 't1', 't2', 't3', …) is in "
        "the model, whose 26 tables are 'cat_0', 'cat_1', 'cat_2', 'cat_3', …"
    ) in err
    assert main(["plan", "validate", str(rr), "--workload", "tiny", "--max-rows", "4000"]) == 2
    err = capsys.readouterr().err
    for t, rows in (("t1", 5000), ("t2", 20000), ("t3", 100000), ("t5", 50000), ("t7", 80000)):
        assert f"table '{t}' has 4000 rows in the model, {rows} in the plan" in err
    assert main(["plan", "validate", str(rr), "--workload", "tiny", "--world-size", "4"]) == 2
    assert "plan is for world_size 2, this job has 4 ranks" in capsys.readouterr().err


def test_nothing_is_written_on_bad_input(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert (
        main(
            [
                "plan",
                "from-torchrec",
                "--workload",
                "tiny",
                "--world-size",
                "2",
                "--device",
                "tpu",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert "unknown --device preset 'tpu'" in capsys.readouterr().err
    assert (
        main(
            [
                "plan",
                "round-robin",
                "--workload",
                "tiny",
                "--world-size",
                "3",
                "--local-world-size",
                "2",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert (
        main(["plan", "round-robin", "--workload", "nope", "--world-size", "2", "--out", str(out)])
        == 2
    )
    assert list(tmp_path.iterdir()) == []


def test_train_and_bench_refuse_bad_plans_before_any_rank_starts(tmp_path, rr, capsys):
    bad = tmp_path / "bad.json"
    d = doc(round_robin(2))
    d["model"]["tables"][0]["num_embeddings"] = 5
    d["tables"][0]["shards"][0]["sizes"] = [5, 32]
    write(bad, d)
    assert main(["train", "--workload", "tiny", "--nproc", "2", "--plan", str(bad)]) == 2
    assert "table 't0' has 1000 rows in the model, 5 in the plan" in capsys.readouterr().err
    assert main(["train", "--workload", "tiny", "--nproc", "4", "--plan", str(rr)]) == 2
    assert "plan is for world_size 2, this job has 4 ranks" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--workload",
                "tiny",
                "--nproc",
                "2",
                "--plan",
                str(rr),
                "--plan",
                str(bad),
                "--json",
                str(out),
            ]
        )
        == 2
    )
    assert "5 in the plan" in capsys.readouterr().err
    assert not out.exists()
    assert main(["bench", "--workload", "tiny", "--nproc", "2"]) == 2
    assert "nothing to measure" in capsys.readouterr().err
