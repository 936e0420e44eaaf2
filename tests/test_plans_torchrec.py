"""The loader against real TorchRec: ShardingPlan, sharders, PlanLoader, 2-rank gloo DMP runs."""

from __future__ import annotations

import json
import os
import types
from pathlib import Path

import pytest
import torch
from plans_helpers import DLRM_EBC, mixed, round_robin
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline import TrainPipelineBase, TrainPipelineSparseDist
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from sparselift import plans
from sparselift.cli import main
from sparselift.plans import PlanError, TablePlan
from sparselift.workloads.harness import TrainConfig, run_training
from sparselift.workloads.models import build_model
from sparselift.workloads.spec import load_workload

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def tiny_model():
    return build_model(load_workload("tiny"), dense_device=torch.device("cpu"))


def test_sharding_plan_matches_the_plan(tiny_model):
    p = mixed()
    sp = p.sharding_plan(tiny_model)
    assert isinstance(sp, ShardingPlan) and list(sp.plan) == [DLRM_EBC]
    module_plan = sp.plan[DLRM_EBC]
    assert (
        module_plan["t0"].sharding_type == "data_parallel"
        and module_plan["t0"].sharding_spec is None
    )
    assert module_plan["t0"].ranks == [0, 1]
    t3 = module_plan["t3"]
    assert (t3.sharding_type, t3.compute_kernel, t3.ranks) == ("column_wise", "fused", [1, 0])
    assert [
        (m.shard_offsets, m.shard_sizes, str(m.placement)) for m in t3.sharding_spec.shards
    ] == [([0, 0], [100000, 16], "rank:1/cpu"), ([0, 16], [100000, 16], "rank:0/cpu")]


def test_module_path_is_found_by_walking_the_model():
    class Outer(nn.Module):
        def __init__(self, tables):
            super().__init__()
            self.towers = nn.ModuleDict(
                {
                    "sparse": EmbeddingBagCollection(
                        tables=[
                            EmbeddingBagConfig(
                                name=t.name,
                                num_embeddings=t.num_embeddings,
                                embedding_dim=t.embedding_dim,
                                feature_names=list(t.feature_names),
                            )
                            for t in tables
                        ],
                        device=torch.device("meta"),
                    )
                }
            )

    p = round_robin(2)
    model = Outer(p.model)
    p.check(model, 2)
    assert list(p.sharding_plan(model).plan) == ["towers.sparse"]
    smaller = Outer(p.model[:-1])
    with pytest.raises(PlanError, match="table 't7' is in the plan but not in the model"):
        p.check(smaller, 2)


def test_sharders_carry_qcomm_codecs_and_pipeline_class():
    plain, plain_seq, plain_fp = round_robin(2).sharders()
    assert isinstance(plain, EmbeddingBagCollectionSharder) and plain.qcomm_codecs_registry is None
    assert isinstance(plain_seq, EmbeddingCollectionSharder)
    assert plain_seq.qcomm_codecs_registry is None
    quant, quant_seq, quant_fp = mixed("fp16").sharders()
    registry = quant.qcomm_codecs_registry
    assert registry and "pooled_embeddings_all_to_all" in {str(k).lower() for k in registry}
    assert quant_fp._ebc_sharder.qcomm_codecs_registry == registry  # the same codecs
    assert plain_fp._ebc_sharder.qcomm_codecs_registry is None
    seq_registry = quant_seq.qcomm_codecs_registry  # the sequence all-to-all at the same precision
    assert seq_registry and "sequence_embeddings_all_to_all" in {
        str(k).lower() for k in seq_registry
    }
    assert round_robin(2).pipeline_class() is TrainPipelineBase
    assert mixed(pipeline="sparse-dist").pipeline_class() is TrainPipelineSparseDist


def test_apply_fails_closed_before_building_dmp(tiny_model):
    p = round_robin(2)
    pg = types.SimpleNamespace(
        size=lambda: 4
    )  # apply asks the group only for its size before refusing
    with pytest.raises(PlanError) as e:
        p.apply(tiny_model, pg=pg, device=torch.device("cuda"))
    assert e.value.problems == [
        "plan is for world_size 2, this job has 4 ranks",
        "plan is for cpu, this job runs on cuda",
    ]


def test_plan_loader_feeds_torchrecs_planner(tiny_model):
    p = round_robin(2)
    p.tables[0] = TablePlan("t0", "data_parallel", "dense", [0, 1], [])
    p = plans.Plan.from_dict(p.to_dict())
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        batch_size=256,
        plan_loader=p.plan_loader(tiny_model),
    )
    sp = planner.plan(tiny_model, [EmbeddingBagCollectionSharder()])
    back = plans.from_torchrec(sp, p.model, p.topology)
    assert [(t.name, t.sharding_type, t.ranks, t.shards) for t in back.tables] == [
        (t.name, t.sharding_type, t.ranks, t.shards) for t in p.tables
    ]


def test_from_torchrec_round_trips_the_planners_plan(tiny_model):
    topo = plans.PlanTopology(4, 2, "cuda")
    sp = plans.torchrec_plan(tiny_model, topo, 256)
    p = plans.from_torchrec(sp, round_robin(2).model, topo)
    again = p.sharding_plan(tiny_model)
    for name, ps in sp.plan[DLRM_EBC].items():
        mine = again.plan[DLRM_EBC][name]
        assert (mine.sharding_type, mine.compute_kernel, mine.ranks) == (
            ps.sharding_type,
            ps.compute_kernel,
            ps.ranks,
        )
        if ps.sharding_spec is not None:
            assert [
                (m.shard_offsets, m.shard_sizes, str(m.placement))
                for m in mine.sharding_spec.shards
            ] == [
                (m.shard_offsets, m.shard_sizes, str(m.placement)) for m in ps.sharding_spec.shards
            ]


@pytest.fixture
def ranks_import_tests(monkeypatch):
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    )


@pytest.mark.slow
def test_two_rank_gloo_dmp_shards_every_table_as_planned(tmp_path, ranks_import_tests):
    plan = mixed("fp16", "sparse-dist")
    path = tmp_path / "mixed.json"
    plans.save(plan, path)
    result = run_training(
        TrainConfig(
            workload="tiny",
            nproc=2,
            steps=2,
            warmup=1,
            plan=str(path),
            device="cpu",
            hook="plans_layout_hook:layout",
        )
    )
    assert result.pipeline == "sparse-dist"
    fps = {t.name: t for t in plan.model}
    for rank_result in result.ranks:
        got = rank_result.extra
        assert got["pipeline_class"] == "TrainPipelineSparseDist"
        assert got["built_sharding_types"] == sorted({t.sharding_type for t in plan.tables})
        for t in plan.tables:
            layout = got["tables"][t.name]
            assert (layout["sharding_type"], layout["compute_kernel"], layout["ranks"]) == (
                t.sharding_type,
                t.compute_kernel,
                t.ranks,
            ), t.name
            if t.sharding_type == "data_parallel":
                assert layout["replicated_shape"] == [
                    fps[t.name].num_embeddings,
                    fps[t.name].embedding_dim,
                ]
                continue
            assert layout["global_shards"] == sorted(
                [s.rank, list(s.offsets), list(s.sizes)] for s in t.shards
            )
            assert layout["local_shards"] == sorted(
                [list(s.offsets), list(s.sizes)] for s in t.shards if s.rank == rank_result.rank
            ), (t.name, rank_result.rank)


@pytest.mark.slow
def test_train_and_bench_with_plans_end_to_end(tmp_path, capsys):
    rr = tmp_path / "rr.json"
    plans.save(round_robin(2), rr)
    assert (
        main(
            [
                "train",
                "--workload",
                "tiny",
                "--nproc",
                "2",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--device",
                "cpu",
                "--plan",
                str(rr),
            ]
        )
        == 0
    )
    assert "tiny: 2 ranks (cpu/gloo), pipeline base" in capsys.readouterr().out
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "bench",
                "--workload",
                "tiny",
                "--nproc",
                "2",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--device",
                "cpu",
                "--rounds",
                "1",
                "--plan",
                str(rr),
                "--vs",
                "torchrec",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "rr.json" in table and "torchrec" in table and "ratio" in table
    got = json.loads(out.read_text())
    assert [c["label"] for c in got["contenders"]] == ["rr.json", "torchrec"]
    assert got["contenders"][0]["ratio"] == 1.0
    assert all(len(c["steps_per_s"]) == 1 and c["median"] > 0 for c in got["contenders"])
    assert got["runs"] == "side by side in one job"
    argv = ["bench", "--workload", "tiny", "--nproc", "2", "--steps", "2", "--warmup", "1"]
    argv += ["--rounds", "2", "--plan", str(rr), "--separate-runs", "--json", str(out)]
    assert main(argv) == 0
    got = json.loads(out.read_text())
    assert got["runs"] == "separate jobs, interleaved"
    assert "2 rounds × 2 steps, separate jobs" in capsys.readouterr().out
    assert [len(c["steps_per_s"]) for c in got["contenders"]] == [2]
