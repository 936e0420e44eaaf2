"""Models with TorchRec collections other than the EmbeddingBagCollection: found, priced,
planned and loaded.

An EmbeddingCollection's table (a sequence table) returns one row per id, not one per sample,
and TorchRec shards it only table-, column-, row-wise or data-parallel: the plan file says which
tables are sequence tables, the loader shards them with the EmbeddingCollection sharder, and the
optimizer prices their output collectives by their ids. A FeatureProcessedEmbeddingBagCollection
(e.g. position-weighted features) is sharded where TorchRec's sharder for it puts it, and its
tables are never split: its feature processors read the model's own features.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pandas as pd
import pytest
import torch
from torchrec import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    KeyedJaggedTensor,
)
from torchrec.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

from sparselift import plans
from sparselift.analysis.fit import fit_ops
from sparselift.analysis.reconstruct import attach_tables
from sparselift.analysis.samples import SAMPLE_COLUMNS, call_samples, lookup_context, lookup_parts
from sparselift.analysis.type_overhead import model_parallel_types
from sparselift.analysis.volumes import dist_bytes
from sparselift.cli import main
from sparselift.errors import UserError
from sparselift.kernels import FLOAT_BYTES
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel, type_fixed_costs
from sparselift.optimizer.counts import class_counts
from sparselift.optimizer.profile_input import plan_in_force
from sparselift.optimizer.space import FUSED, RW, TW, TWRW, Choice, OptionClass, enumerate_classes
from sparselift.optimizer.split_options import split_options
from sparselift.optimizer.table_stats import TableStats
from sparselift.optimizer.topology import preset
from sparselift.plans.render import diff, show
from sparselift.plans.to_torchrec import model_tables
from sparselift.profile_manifest import check_unique_tables
from sparselift.profiler.access import TableMeta, warn_duplicate_tables


class TwoCollections(torch.nn.Module):
    """A pooled table and a sequence table, each in its own collection (and, `weighted`, a
    position-weighted table in a FeatureProcessedEmbeddingBagCollection)."""

    def __init__(self, device: str = "meta", weighted: bool = False) -> None:
        super().__init__()
        dev = torch.device(device)
        if weighted:
            bags = EmbeddingBagCollection(
                tables=[
                    EmbeddingBagConfig(
                        name="pos", embedding_dim=8, num_embeddings=50, feature_names=["p"]
                    )
                ],
                is_weighted=True,
                device=dev,
            )
            self.fp = FeatureProcessedEmbeddingBagCollection(
                bags, PositionWeightedModuleCollection({"p": 4}, device=dev)
            )
        self.bags = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name="user", embedding_dim=8, num_embeddings=100, feature_names=["u"]
                )
            ],
            device=dev,
        )
        self.seq = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name="history", embedding_dim=8, num_embeddings=200, feature_names=["h"]
                )
            ],
            device=dev,
        )


def _plan(sequence_type: str = "table_wise", sequence: bool = True) -> plans.Plan:
    tables = [
        plans.TableFingerprint("user", 100, 8, ("u",)),
        plans.TableFingerprint("history", 200, 8, ("h",), sequence=sequence),
    ]
    shards = {
        "table_wise": [plans.Shard(1, (0, 0), (200, 8))],
        "row_wise": [plans.Shard(0, (0, 0), (100, 8)), plans.Shard(1, (100, 0), (100, 8))],
        "table_row_wise": [plans.Shard(0, (0, 0), (100, 8)), plans.Shard(1, (100, 0), (100, 8))],
    }[sequence_type]
    return plans.Plan(
        model=tables,
        topology=plans.PlanTopology(world_size=2, local_world_size=2, device="cpu"),
        tables=[
            plans.TablePlan("user", "table_wise", "fused", [0], [plans.Shard(0, (0, 0), (100, 8))]),
            plans.TablePlan("history", sequence_type, "fused", [s.rank for s in shards], shards),
        ],
    )


def test_the_loader_finds_sequence_tables_and_the_plan_file_keeps_them(tmp_path):
    found = {t.table.name: (t.path, t.table.sequence) for t in model_tables(TwoCollections())}
    assert found == {"user": ("bags", False), "history": ("seq", True)}
    plan = _plan()
    path = tmp_path / "plan.json"
    plans.save(plan, path)
    tables = json.loads(path.read_text())["model"]["tables"]
    assert [t.get("sequence") for t in tables] == [None, True]  # written only where true
    again = plans.load(path)
    assert again.model == plan.model
    again.check(TwoCollections(), 2)
    sp = again.sharding_plan(TwoCollections())
    assert set(sp.plan) == {"bags", "seq"} and sp.plan["seq"]["history"].ranks == [1]
    option = next(o for o in again.plan_loader().load().values() if o.name == "history")
    assert option.is_pooled is False
    assert "  model       2 tables, 1 in an EmbeddingCollection: history\n" in show(again)


def _weighted_plan(splits: bool) -> plans.Plan:
    plan = _plan()
    pos = plans.TableFingerprint("pos", 50, 8, ("p",))
    tables = [plans.TablePlan("pos", "table_wise", "fused", [0], [plans.Shard(0, (0, 0), (50, 8))])]
    if splits:
        tables = [
            plans.TablePlan(
                f"pos{i}", "table_wise", "fused", [i], [plans.Shard(i, (0, 0), (25, 8))]
            )
            for i in range(2)
        ]
    return dataclasses.replace(
        plan,
        model=[pos, *plan.model],
        tables=tables + plan.tables,
        splits=[plans.Split("pos", "row_ranges", ("pos0", "pos1"), ranges=((0, 25), (25, 50)))]
        if splits
        else [],
    )


def test_a_feature_processed_collection_is_sharded_whole_and_never_split():
    model = TwoCollections(weighted=True)
    assert [(t.path, t.table.name) for t in model_tables(model)] == [
        ("fp", "pos"),
        ("bags", "user"),
        ("seq", "history"),
    ]  # at the FeatureProcessedEmbeddingBagCollection, not at its own collection
    plan = _weighted_plan(splits=False)
    assert set(plan.sharding_plan(model).plan) == {"fp", "bags", "seq"}
    assert any(
        isinstance(s, FeatureProcessedEmbeddingBagCollectionSharder) for s in plan.sharders()
    )
    split = _weighted_plan(splits=True)
    group = types.SimpleNamespace(size=lambda: 2)  # refused before anything is built
    with pytest.raises(plans.PlanError) as e:
        split.apply(model, pg=group, device=torch.device("cpu"))
    assert e.value.problems == [
        "table 'pos' is feature-processed ('fp' is a FeatureProcessedEmbeddingBagCollection): "
        "its feature processors read the model's features, so it cannot be split"
    ]
    stats = TableStats("pos", 50_000, 8, 4.0, feature_processed=True, feature_names=("p",))
    assert split_options([stats], 4) == {}
    assert "pos" in split_options([dataclasses.replace(stats, feature_processed=False)], 4)


def test_a_plan_that_takes_a_sequence_table_for_a_pooled_one_is_refused():
    with pytest.raises(plans.PlanError) as e:
        _plan(sequence=False).check(TwoCollections(), 2)
    assert e.value.problems == [
        "table 'history' is an EmbeddingCollection's in the model, an EmbeddingBagCollection's "
        "in the plan"
    ]


def test_sharding_types_an_embedding_collection_lacks_are_refused():
    with pytest.raises(plans.PlanError) as e:
        plans.Plan.from_dict(_plan("table_row_wise").to_dict(), "p.json")
    assert any(
        "table 'history': table_row_wise is not offered for an EmbeddingCollection's table" in p
        for p in e.value.problems
    )
    plans.Plan.from_dict(_plan("row_wise").to_dict(), "p.json")  # row-wise is offered


def test_a_split_of_a_sequence_table_is_refused():
    d = _plan().to_dict()
    d["version"] = 2
    d["splits"] = [
        {
            "table": "history",
            "kind": "row_ranges",
            "parts": ["h0", "h1"],
            "row_ranges": [[0, 100], [100, 200]],
        }
    ]
    with pytest.raises(plans.PlanError) as e:
        plans.Plan.from_dict(d, "p.json")
    assert any(
        "only pooled (EmbeddingBagCollection) tables are split" in p for p in e.value.problems
    )


def test_the_profiled_plan_keeps_its_sequence_tables():
    manifest = {
        "world_size": 2,
        "local_world_size": 2,
        "device": "cpu",
        "pipeline": "TrainPipelineSparseDist",
        "tables": [
            {
                "name": "user",
                "num_embeddings": 100,
                "embedding_dim": 8,
                "feature_names": ["u"],
                "pooling_type": "SUM",
            },
            {
                "name": "history",
                "num_embeddings": 200,
                "embedding_dim": 8,
                "feature_names": ["h"],
                "pooling_type": "NONE",
            },
        ],
        "sharding": [t | {"table": t["name"]} for t in _plan().to_dict()["tables"]],
    }
    plan = plan_in_force(manifest)
    assert plan is not None and plan.pipeline == "sparse-dist"
    assert plan.model == _plan().model  # "history" is a sequence table there too
    plan.check(TwoCollections(), 2)


def _stats(sequence: bool) -> TableStats:
    return TableStats(
        "history",
        200_000,
        64,
        ids_per_sample=20.0,
        zipf_alpha=1.0,
        feature_names=("h",),
        sequence=sequence,
    )


def test_sequence_outputs_are_priced_per_id_and_row_wise_as_an_all_to_all():
    topo = preset("cpu-gloo", 4)
    batch = 128
    pooled, seq = _stats(False), _stats(True)
    tw_pooled = class_counts(topo, batch, pooled, OptionClass(TW, "fused"))
    tw_seq = class_counts(topo, batch, seq, OptionClass(TW, "fused"))
    assert tw_pooled.own.out_fwd_intra == 3 * batch * 64 * FLOAT_BYTES
    assert tw_seq.own.out_fwd_intra == 3 * batch * 20 * 64 * FLOAT_BYTES  # every id's row
    assert tw_seq.own.ids_intra == tw_pooled.own.ids_intra  # the ids travel the same way
    assert tw_seq.own.fwd_work > tw_pooled.own.fwd_work  # more output rows written
    rw_seq = class_counts(topo, batch, seq, OptionClass(RW, "fused", 4))
    rw_pooled = class_counts(topo, batch, pooled, OptionClass(RW, "fused", 4))
    # pooled row-wise on gloo: a ring all-reduce of the whole W·B·d output; sequence: an
    # all-to-all of the rows of the ids sent away
    assert rw_pooled.own.out_fwd_intra == pytest.approx(2 * 3 / 4 * 4 * batch * 64 * FLOAT_BYTES)
    assert rw_seq.own.out_fwd_intra == pytest.approx(3 * batch * 20 * 64 * FLOAT_BYTES / 4)


def test_the_optimizer_offers_a_sequence_table_only_what_torchrec_can_run():
    topo = preset("h100x8", 16)
    assert topo.num_hosts == 2
    assert any(c.sharding_type == TWRW for c in enumerate_classes(_stats(False), topo, 128))
    assert not any(c.sharding_type == TWRW for c in enumerate_classes(_stats(True), topo, 128))
    offered = split_options([dataclasses.replace(_stats(False), name="bag"), _stats(True)], 4)
    assert "bag" in offered and "history" not in offered  # the same table pooled has splits


def _history_on_rank1() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Access statistics and plan of one table, `history`, table-wise on rank 1: 500 and 300
    ids from ranks 0 and 1 in step 3."""
    access = pd.DataFrame(
        {
            "table": ["history"] * 2,
            "rank": [0, 1],
            "step": [3, 3],
            "ids": [500, 300],
            "num_embeddings": [200, 200],
            "embedding_dim": [8, 8],
            "zipf_alpha": [0.0, 0.0],
            "batch_size": [64, 64],
        }
    )
    shards = pd.DataFrame(
        [
            {
                "table": "history",
                "module": "seq",
                "sharding_type": "table_wise",
                "rank": 1,
                "rows": 200,
                "cols": 8,
            }
        ]
    )
    return access, shards


def test_analysis_counts_a_sequence_tables_outputs_from_its_ids():
    access, shards = _history_on_rank1()
    manifest = {
        "world_size": 2,
        "batch_size": 64,
        "backend": "gloo",
        "device": "cpu",
        "tables": [{"name": "history", "feature_names": ["h"], "pooling_type": "NONE"}],
    }
    got = dist_bytes(access, shards, manifest)
    fwd = got[(got["kind"] == "output_dist_fwd")].set_index("rank")["x"]
    # rank 0's 500 ids come back from rank 1 as 500 rows (counted at both ends on gloo)
    assert fwd.to_dict() == {0: 500 * 8 * FLOAT_BYTES, 1: 500 * 8 * FLOAT_BYTES}
    manifest["tables"][0]["pooling_type"] = "SUM"
    pooled = dist_bytes(access, shards, manifest)
    fwd = pooled[(pooled["kind"] == "output_dist_fwd")].set_index("rank")["x"]
    assert fwd.to_dict() == {0: 64 * 8 * FLOAT_BYTES, 1: 64 * 8 * FLOAT_BYTES}


# One rank of a user's trainer whose model has an EmbeddingBagCollection and an
# EmbeddingCollection, trained by TorchRec's TrainPipelineSparseDist on 8 batches: `profile OUT`
# shards it with TorchRec's default plan and profiles a window (`profile_pipeline`; the data ends
# before the default 10 steady steps); `apply PLAN RESULT [OUT]` shards it by a SparseLift plan,
# trains under the plan's pipeline (and profiles it into OUT) and reports how it was sharded.
TRAINER = textwrap.dedent("""
    import json, os, sys
    from dataclasses import dataclass
    import torch, torch.distributed as dist
    from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,
                          KeyedJaggedTensor)
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fp_embeddingbag import (
        FeatureProcessedEmbeddingBagCollectionSharder)
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.modules.embedding_configs import EmbeddingConfig
    from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
    from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.streamable import Pipelineable
    import sparselift.plans
    from sparselift.profiler import profile_pipeline

    @dataclass
    class Batch(Pipelineable):
        seq: KeyedJaggedTensor
        bags: KeyedJaggedTensor
        pos: KeyedJaggedTensor

        def to(self, device, non_blocking=False):
            return Batch(self.seq.to(device), self.bags.to(device), self.pos.to(device))

        def record_stream(self, stream):
            pass

        def pin_memory(self):
            return self

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    meta, cpu = torch.device("meta"), torch.device("cpu")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ec = EmbeddingCollection(tables=[EmbeddingConfig(
                name="history", embedding_dim=16, num_embeddings=4000, feature_names=["h"])],
                device=meta)
            self.ebc = EmbeddingBagCollection(tables=[
                EmbeddingBagConfig(name="user", embedding_dim=16, num_embeddings=3000,
                                   feature_names=["u"]),
                EmbeddingBagConfig(name="item", embedding_dim=16, num_embeddings=2000,
                                   feature_names=["i"])], device=meta)
            self.fp = FeatureProcessedEmbeddingBagCollection(EmbeddingBagCollection(tables=[
                EmbeddingBagConfig(name="position", embedding_dim=16, num_embeddings=1000,
                                   feature_names=["p"])], is_weighted=True, device=meta),
                PositionWeightedModuleCollection({"p": 8}, device=meta))
            self.top = torch.nn.Linear(48, 1)

        def forward(self, batch):
            history = self.ec(batch.seq)["h"].values().pow(2).mean()
            pooled = torch.cat([self.ebc(batch.bags).values(), self.fp(batch.pos).values()], 1)
            loss = self.top(pooled).pow(2).mean() + history
            return loss, loss.detach()

    model = Model()
    for m in (model.ec, model.ebc, model.fp._embedding_bag_collection):
        apply_optimizer_in_backward(torch.optim.SGD, m.parameters(), {"lr": 0.05})
    plan = None
    if sys.argv[1] == "profile":
        dmp = DistributedModelParallel(model, device=cpu, sharders=[
            EmbeddingCollectionSharder(), EmbeddingBagCollectionSharder(),
            FeatureProcessedEmbeddingBagCollectionSharder()])
        pipeline_class = TrainPipelineSparseDist
    else:
        plan = sparselift.plans.load(sys.argv[2])
        dmp = plan.apply(model, pg=dist.GroupMember.WORLD, device=cpu)
        pipeline_class = plan.pipeline_class()
    dense = torch.optim.SGD(dmp.module.top.parameters(), lr=0.05)

    def batches(n, b=32):
        for i in range(n):
            g = torch.Generator().manual_seed(1000 * rank + i)
            k = torch.randint(1, 8, (b,), generator=g)
            seq = KeyedJaggedTensor.from_lengths_sync(
                ["h"], torch.randint(0, 4000, (int(k.sum()),), generator=g), k)
            m = torch.randint(1, 4, (2 * b,), generator=g)
            bags = KeyedJaggedTensor.from_lengths_sync(
                ["u", "i"], torch.randint(0, 2000, (int(m.sum()),), generator=g), m)
            k = torch.randint(1, 8, (b,), generator=g)
            pos = KeyedJaggedTensor.from_lengths_sync(
                ["p"], torch.randint(0, 1000, (int(k.sum()),), generator=g), k)
            if plan is not None and plan.splits:  # the split tables' collection's batch
                bags = plan.transform_batch(bags)
            yield Batch(seq, bags, pos)

    pipeline = pipeline_class(dmp, dense, cpu)
    if sys.argv[1] == "profile":
        pipeline = profile_pipeline(pipeline, sys.argv[2], warmup=2, steps=2)
    elif len(sys.argv) > 4:  # profiled under the plan it loaded
        pipeline = profile_pipeline(pipeline, sys.argv[4], warmup=2, steps=2, plan=plan)
    data, losses = batches(8), []
    while True:
        try:
            losses.append(float(pipeline.progress(data)))
        except StopIteration:
            break
    if sys.argv[1] == "apply":
        sharding = {t: ps.sharding_type for mp in dmp.plan.plan.values() for t, ps in mp.items()}
        json.dump(dict(losses=losses, sharding=sharding, paths=sorted(dmp.plan.plan)),
                  open(f"{sys.argv[3]}.{rank}", "w"))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)
""")


def _torchrun(script: Path, *args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        *args,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]


@pytest.mark.slow
def test_a_model_with_an_embedding_collection_is_profiled_planned_and_loaded(tmp_path, capsys):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    prof, plan_path = tmp_path / "prof", tmp_path / "plan.json"
    _torchrun(script, "profile", str(prof))
    manifest = json.loads((prof / "manifest.json").read_text())
    kinds = {t["name"]: (t["pooling_type"], t["feature_processed"]) for t in manifest["tables"]}
    assert kinds == {
        "history": ("NONE", False),
        "user": ("SUM", False),
        "item": ("SUM", False),
        "position": ("SUM", True),
    }
    assert manifest["errors"] == []
    # the data ended after 4 steady steps: they are kept, though no one called finish()
    assert manifest["pipeline"] == "TrainPipelineSparseDist" and manifest["profiled_steps"] == [
        2,
        3,
    ]
    assert len(manifest["steady_step_s"]) == 4
    assert main(["analyze", str(prof)]) == 0
    # the EmbeddingCollection's backward (FBGEMM's "nobag" kernel, outside any tagged range) is
    # its lookup's backward, each step's kernel inside that step's node
    trace = json.loads(gzip.open(prof / "rank0.trace.json.gz").read())
    kernel_s = sorted(
        e["dur"] * 1e-6
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
        and e["name"].startswith("fbgemm::split_embedding_nobag_backward")
        and e["name"].endswith("_cpu")  # the kernel, not its wrapper
    )
    nodes = pd.read_parquet(prof / "nodes.parquet")
    ec_bwd = nodes[
        (nodes["rank"] == 0) & (nodes["kind"] == "lookup_bwd") & (nodes["module"] == "ec")
    ]
    node_s = sorted(ec_bwd.groupby("step")["dur_s"].sum())
    assert len(kernel_s) == len(node_s) == 2
    assert all(n >= k for n, k in zip(node_s, kernel_s, strict=True)), (node_s, kernel_s)
    assert main(["optimize", "--profile", str(prof), "--out", str(plan_path)]) == 0
    written = json.loads(plan_path.read_text())
    assert {t["name"]: t.get("sequence", False) for t in written["model"]["tables"]} == {
        "history": True,
        "user": False,
        "item": False,
        "position": False,
    }
    # where each table's collection is, as TorchRec's sharders put them
    assert {t["name"]: t["module"] for t in written["model"]["tables"]} == {
        "history": "ec",
        "user": "ebc",
        "item": "ebc",
        "position": "fp",
    }
    # TorchRec's planner planned the EmbeddingCollection too (no "not in the plan" refusal),
    # and the plan keeps to what an EmbeddingCollection can run
    assert "splits" not in written
    by_name = {t["name"]: t for t in written["tables"]}
    assert by_name["history"]["sharding_type"] in (
        "data_parallel",
        "table_wise",
        "column_wise",
        "row_wise",
    )
    result = tmp_path / "result"
    # applied under the base pipeline and profiled there, to be calibrated with the split below
    base_path, prof_plain = tmp_path / "plan_base.json", tmp_path / "prof_plain"
    base_path.write_text(json.dumps(dict(written, pipeline="base")))
    _torchrun(script, "apply", str(base_path), str(result), str(prof_plain))
    for r in range(2):
        got = json.loads(Path(f"{result}.{r}").read_text())
        assert got["paths"] == ["ebc", "ec", "fp"]  # TorchRec's sharder for each collection
        assert got["sharding"] == {n: t["sharding_type"] for n, t in by_name.items()}
        assert len(got["losses"]) == 8 and all(x == x and x < 1e6 for x in got["losses"])
    # the same model under a plan that splits `user` in two row ranges, profiled in the
    # trainer: the profile records the plan, so it is of the same job as the first one
    split = dict(
        written,
        version=2,
        pipeline="base",
        splits=[
            {
                "table": "user",
                "kind": "row_ranges",
                "parts": ["user__rows0", "user__rows1"],
                "row_ranges": [[0, 1500], [1500, 3000]],
            }
        ],
    )
    split["tables"] = [t for t in written["tables"] if t["name"] != "user"] + [
        {
            "name": f"user__rows{r}",
            "sharding_type": "table_wise",
            "compute_kernel": "fused",
            "ranks": [r],
            "shards": [{"rank": r, "offsets": [0, 0], "sizes": [1500, 16]}],
            "cache_load_factor": None,
        }
        for r in range(2)
    ]
    split_path, prof_split = tmp_path / "split.json", tmp_path / "prof_split"
    split_path.write_text(json.dumps(split))
    _torchrun(script, "apply", str(split_path), str(result), str(prof_split))
    recorded = json.loads((prof_split / "manifest.json").read_text())
    assert [t["name"] for t in recorded["model_tables"]] == [
        t["name"] for t in written["model"]["tables"]
    ]
    assert recorded["splits"] == split["splits"] and recorded["errors"] == []
    assert main(["analyze", str(prof_plain), str(prof_split)]) == 0
    assert "calibrated on 2 profiles together" in capsys.readouterr().out


def test_a_sequence_tables_lookup_writes_a_row_per_id():
    access, shards = _history_on_rank1()
    node = pd.DataFrame(
        [{"kind": "lookup_fwd", "rank": 1, "ids": 800, "x": 6400, "tables": "history"}]
    )
    pooled = lookup_parts(node, lookup_context(access, shards), world_size=2)
    seq = lookup_parts(node, lookup_context(access, shards, frozenset({"history"})), 2)
    assert pooled["bag_elems"].tolist() == [2 * 64 * 8]  # every rank's bags
    assert seq["bag_elems"].tolist() == [800 * 8]  # every id's row
    assert seq["unique"].tolist() == pooled["unique"].tolist()


def test_a_table_name_two_collections_share_is_refused_by_name_and_collection(tmp_path):
    model = TwoCollections()
    model.more = EmbeddingCollection(
        tables=[
            EmbeddingConfig(name="user", embedding_dim=8, num_embeddings=10, feature_names=["x"])
        ],
        device=torch.device("meta"),
    )
    problem = (
        "table 'user' is in 2 collections of the model ('bags', 'more'): a plan names its "
        "tables, so rename all but one"
    )
    with pytest.raises(plans.PlanError) as e:
        _plan().check(model, 2)
    assert e.value.problems == [problem]
    with pytest.raises(plans.PlanError) as e:
        _plan().sharding_plan(model)
    assert e.value.problems == [problem]
    # the profiler warns and writes; analysis and planning refuse such a profile by name
    metas = [
        TableMeta("user", 100, 8, ("u",), "SUM", "bags"),
        TableMeta("user", 10, 8, ("x",), "NONE", "more"),
    ]
    with pytest.warns(RuntimeWarning, match=r"table 'user' is in 2 collections \('bags', 'more'\)"):
        warn_duplicate_tables(metas)
    manifest = {"tables": [{"name": m.name, "module": m.module} for m in metas]}
    with pytest.raises(UserError) as e:
        check_unique_tables(tmp_path, manifest)
    assert str(e.value) == (
        f"{tmp_path / 'manifest.json'}: table 'user' is in 2 collections of the model ('bags', "
        "'more'): SparseLift keeps statistics and plans per table name, so rename all but one "
        "and profile again"
    )
    check_unique_tables(tmp_path, {"tables": manifest["tables"][:1]})


def test_each_collections_lookup_is_given_its_own_tables():
    # rank 0 holds one table of `seq` and none of `bags`; both modules' lookups run there
    shards = pd.DataFrame(
        [
            {
                "table": "history",
                "module": "seq",
                "sharding_type": "table_wise",
                "rank": 0,
                "rows": 200,
                "cols": 8,
            },
            {
                "table": "user",
                "module": "bags",
                "sharding_type": "table_wise",
                "rank": 1,
                "rows": 100,
                "cols": 8,
            },
        ]
    )
    nodes = pd.DataFrame(
        [
            {
                "stage": "lookup",
                "sharding": "table_wise",
                "rank": 0,
                "module": "seq",
                "ids": 50,
                "kind": "lookup_fwd",
                "bytes": 0,
            },
            {
                "stage": "lookup",
                "sharding": "table_wise",
                "rank": 0,
                "module": "bags",
                "ids": 0,
                "kind": "lookup_fwd",
                "bytes": 0,
            },
            {
                "stage": "lookup",
                "sharding": "table_wise",
                "rank": 0,
                "module": "*",
                "ids": 50,
                "kind": "lookup_fwd",
                "bytes": 0,
            },
        ]
    )
    got = attach_tables(nodes, shards)
    # a module the plan does not name ("*") keeps every table of its rank and type
    assert got["tables"].tolist() == ["history", "", "history"]


def _towers() -> torch.nn.Module:
    """Two towers, each its own collection fed its own batch; `u` of the user tower is split."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.user = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="u", embedding_dim=8, num_embeddings=40, feature_names=["uf"])
        ],
    )
    model.item = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name="i", embedding_dim=8, num_embeddings=30, feature_names=["if"])
        ],
    )
    return model


def test_a_split_in_one_tower_transforms_that_towers_batch_alone():
    split = plans.Split("u", "row_ranges", ("u__rows0", "u__rows1"), ranges=((0, 25), (25, 40)))
    plan = plans.Plan(
        model=[
            plans.TableFingerprint("u", 40, 8, ("uf",)),
            plans.TableFingerprint("i", 30, 8, ("if",)),
        ],
        topology=plans.PlanTopology(world_size=2, local_world_size=2, device="cpu"),
        tables=[
            plans.TablePlan(
                "u__rows0", "table_wise", "fused", [0], [plans.Shard(0, (0, 0), (25, 8))]
            ),
            plans.TablePlan(
                "u__rows1", "table_wise", "fused", [1], [plans.Shard(1, (0, 0), (15, 8))]
            ),
            plans.TablePlan("i", "table_wise", "fused", [1], [plans.Shard(1, (0, 0), (30, 8))]),
        ],
        splits=[split],
    )
    plan = plans.Plan.from_dict(plan.to_dict())
    user = KeyedJaggedTensor.from_lengths_sync(
        ["uf"], torch.tensor([3, 39, 24, 25, 0]), torch.tensor([2, 1, 2])
    )
    with pytest.raises(plans.PlanError, match="the batch lacks feature 'if'"):
        plan.transform_batch(user)  # before the model is seen: every table's feature
    reference = _towers()
    want = reference.user(user).values()
    model = plan.rewrite(_towers())
    got = model.user(plan.transform_batch(user)).values()  # the item tower's batch is its own
    assert torch.equal(got, want)  # the split tower pools the same rows


def test_a_plan_that_names_each_tables_collection_is_loaded_without_the_model():
    plan = _plan()
    plan = dataclasses.replace(
        plan,
        model=[dataclasses.replace(t, module="seq" if t.sequence else "bags") for t in plan.model],
    )
    again = plans.Plan.from_dict(plan.to_dict())
    assert [t.module for t in again.model] == ["bags", "seq"]
    assert set(again.sharding_plan().plan) == {"bags", "seq"}  # no model given
    # each collection runs its own collectives: two pairs, though both tables are table-wise
    assert "  collectives 2 all-to-all pairs per step (bags table_wise, seq table_wise)" in show(
        again
    )
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology

    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        batch_size=8,
        plan_loader=again.plan_loader(),
    )
    sp = planner.plan(TwoCollections(), again.sharders())
    assert sp.plan["seq"]["history"].ranks == [1] and sp.plan["bags"]["user"].ranks == [0]


def test_plan_show_counts_the_embedding_collections_its_sequence_tables_are_in():
    plan = _plan()
    clicks = plans.TableFingerprint("clicks", 100, 8, ("c",), sequence=True)
    table = plans.TablePlan(
        "clicks", "table_wise", "fused", [0], [plans.Shard(0, (0, 0), (100, 8))]
    )
    plan = dataclasses.replace(plan, model=[*plan.model, clicks], tables=[*plan.tables, table])
    assert ", 2 in an EmbeddingCollection: history, clicks\n" in show(plan)  # no module named
    modules = {"user": "bags", "history": "seq", "clicks": "seq2"}
    plan = dataclasses.replace(
        plan, model=[dataclasses.replace(t, module=modules[t.name]) for t in plan.model]
    )
    assert ", 2 in 2 EmbeddingCollections: history, clicks\n" in show(plan)


def test_plan_diff_names_the_fields_of_a_table_that_differ():
    a, b = _plan(), _plan()
    b = dataclasses.replace(
        b,
        model=[
            dataclasses.replace(t, module="bags", num_embeddings=120) if t.name == "user" else t
            for t in b.model
        ],
    )
    b = dataclasses.replace(
        b,
        tables=[
            dataclasses.replace(t, shards=[plans.Shard(0, (0, 0), (120, 8))])
            if t.name == "user"
            else t
            for t in b.tables
        ],
    )
    lines = diff(a, b)
    assert "model: table 'user': num_embeddings 100 -> 120" in lines
    # a plan that names no collection says nothing about it: not a difference
    assert not any("module" in line for line in lines)
    a = dataclasses.replace(a, module="towers")  # the plan's collection, for every table
    assert "model: table 'user': module 'towers' -> 'bags'" in diff(a, b)
    same = dataclasses.replace(a, model=[dataclasses.replace(t, module="towers") for t in a.model])
    assert diff(a, same) == []


def test_each_collection_runs_its_own_calls_and_the_samples_count_them():
    def node(module: str, sharding: str, dur_s: float, x: float) -> dict:
        return dict(
            rank=0,
            step=3,
            kind="lookup_fwd",
            part="compute",
            module=module,
            sharding=sharding,
            dur_s=dur_s,
            x=x,
        )

    nodes = pd.DataFrame(
        [node("ec", TW, 1e-3, 100.0), node("ebc", TW, 2e-3, 300.0), node("ebc", RW, 5e-4, 50.0)]
    ).assign(bytes=0.0, coll_op=None)
    samples = call_samples(nodes, world_size=2, transfer=False).set_index("group")
    # one sample per sharding type: the two collections' table-wise TBEs are two calls in it
    assert samples.loc[TW, ["x", "y", "n_calls"]].tolist() == pytest.approx([400.0, 3e-3, 2])
    assert samples.loc[RW, "n_calls"] == 1
    assert (samples["calls"] == 3).all()  # the step's TBE calls of that kind


def test_a_profiles_model_parallel_types_are_counted_in_each_collection():
    entries = [("ebc", TW), ("ec", TW), ("ebc", TW), ("ebc", RW), ("ec", "data_parallel")]
    manifest = {"sharding": [{"module": m, "sharding_type": t} for m, t in entries]}
    assert model_parallel_types(manifest) == 3  # ebc's two types and ec's table-wise


def test_a_sample_of_two_collections_calls_is_fitted_as_two_calls():
    a_s, b_s = 2e-3, 1e-9  # what one input distribution costs
    rows = []
    for step in range(6):
        for group, n_calls, x in ((TW, 2, 3e6 + 4e5 * step), (RW, 1, 1e6 + 3e5 * step)):
            y = a_s * n_calls + b_s * x
            for rank in range(2):
                rows.append(
                    (rank, step, "input_dist", group, x, y, 0.0, 0.0, 3, n_calls, 0, 0, 0, 0)
                )
    fit = fit_ops(pd.DataFrame(rows, columns=SAMPLE_COLUMNS))["input_dist"]
    assert (fit.a_s, fit.b_s) == pytest.approx((a_s, b_s), rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_each_collection_pays_for_its_own_collectives_and_tbe_calls():
    topo = preset("cpu-gloo", 2)
    coeffs = coefficients(topo)
    model = CostModel(topo, 128, coeffs)
    tw = OptionClass(TW, FUSED, 1)
    one = [TableStats(n, 5_000, 32, 2.0, feature_names=(n,), collection="ebc") for n in "ab"]
    two = [one[0], dataclasses.replace(one[1], collection="ec")]
    choices = {"a": Choice(tw, ranks=(0,)), "b": Choice(tw, ranks=(1,))}
    step = [model.evaluate({s.name: s for s in st}, choices).step_time_s for st in (one, two)]
    # a second table-wise input and output collective, its framework work and a second TBE
    extra = sum(type_fixed_costs(coeffs, TW)) + coeffs.lookup_fwd.a_s + coeffs.lookup_bwd.a_s
    assert extra > 0
    assert step[1] - step[0] == pytest.approx(extra)


SEQUENCE_SPEC = {
    "name": "seq-small",
    "batch_size": 64,
    "dense_in_features": 4,
    "model": {"arch": "concat-mlp", "dense_arch": [16, 8], "over_arch": [16, 1]},
    "tables": [
        {
            "name": "history",
            "num_embeddings": 20_000,
            "embedding_dim": 16,
            "sequence": True,
            "pooling_factor": 8,
            "pooling": "poisson",
            "zipf_alpha": 0.8,
        },
        {"name": "user", "num_embeddings": 2_000, "embedding_dim": 8, "data_type": "fp16"},
        {"name": "item", "num_embeddings": 1_000, "embedding_dim": 8, "pooling_factor": 2},
    ],
}


@pytest.mark.slow
def test_a_spec_with_a_sequence_table_and_fp16_weights_is_profiled_planned_and_measured(
    tmp_path, capsys
):
    spec, prof, plan = tmp_path / "seq.json", tmp_path / "prof", tmp_path / "plan.json"
    spec.write_text(json.dumps(SEQUENCE_SPEC))
    w = ["--workload", str(spec)]
    assert main(["profile", *w, "--out", str(prof), "--warmup", "2", "--steps", "2"]) == 0
    manifest = json.loads((prof / "manifest.json").read_text())
    assert {(e["table"], e["module"]) for e in manifest["sharding"]} == {
        ("history", "model.embedding_collections.dim16"),
        ("user", "model.embedding_bag_collection"),
        ("item", "model.embedding_bag_collection"),
    }
    assert {t["name"]: t["data_type"] for t in manifest["tables"]} == {
        "history": "fp32",
        "user": "fp16",
        "item": "fp32",
    }
    assert main(["analyze", str(prof)]) == 0
    assert main(["optimize", "--profile", str(prof), "--out", str(plan)]) == 0
    written = {t["name"]: t for t in json.loads(plan.read_text())["model"]["tables"]}
    history = written["history"]
    assert history["sequence"] is True and history["module"] == "model.embedding_collections.dim16"
    assert written["user"]["data_type"] == "fp16" and "data_type" not in written["item"]
    assert main(["plan", "validate", str(plan), *w]) == 0
    capsys.readouterr()
    bench = ["bench", *w, "--plan", str(plan), "--vs", "torchrec", "--rounds", "1", "--steps", "3"]
    assert main(bench) == 0
    assert "torchrec" in capsys.readouterr().out
    # what-if planning of the spec prices the collection's own collectives apart
    whatif = tmp_path / "whatif.json"
    assert (
        main(["optimize", *w, "--world-size", "16", "--device", "h100x8", "--out", str(whatif)])
        == 0
    )
    out = capsys.readouterr().out
    assert "model.embedding_collections.dim16" in out
    assert "None" not in out.split("collectives:")[1]


@pytest.mark.parametrize("export", ["from-torchrec", "round-robin"])
def test_reference_plans_of_a_spec_with_several_collections_say_whose_each_table_is(
    tmp_path, capsys, export
):
    spec, plan = tmp_path / "seq.json", tmp_path / "plan.json"
    spec.write_text(json.dumps(SEQUENCE_SPEC))
    args = ["--workload", str(spec), "--world-size", "2", "--out", str(plan)]
    assert main(["plan", export, *args]) == 0
    written = {t["name"]: t.get("module") for t in json.loads(plan.read_text())["model"]["tables"]}
    assert written == {
        "history": "model.embedding_collections.dim16",
        "user": "model.embedding_bag_collection",
        "item": "model.embedding_bag_collection",
    }
    capsys.readouterr()
    assert main(["plan", "show", str(plan)]) == 0
    collectives = next(ln for ln in capsys.readouterr().out.splitlines() if "collectives" in ln)
    assert "model.embedding_collections.dim16" in collectives  # its own pair, not the EBC's
