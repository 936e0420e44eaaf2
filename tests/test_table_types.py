"""Tables whose weights are not fp32 (e.g. fp16): recorded by the profiler, counted in their own
element size by the optimizer and by TorchRec's estimates, kept in the plan, and a model whose
table holds another type refuses the plan."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.modules.embedding_configs import DataType

from sparselift import plans
from sparselift.analysis.compare import check_same_job
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.profile_input import plan_in_force
from sparselift.optimizer.space import FUSED, TW, OptionClass
from sparselift.optimizer.table_stats import TableStats, stats_from_profile, stats_from_spec
from sparselift.optimizer.topology import preset
from sparselift.plans.render import rank_elements, show
from sparselift.plans.to_torchrec import model_tables
from sparselift.profiler.access import table_metas
from sparselift.workloads import load_workload
from sparselift.workloads.models import build_model
from sparselift.workloads.spec import parse_workload


def _model(data_type: DataType = DataType.FP16) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name="user",
                embedding_dim=8,
                num_embeddings=100,
                feature_names=["u"],
                data_type=data_type,
            )
        ],
        device=torch.device("meta"),
    )


def _plan(data_type: str) -> plans.Plan:
    return plans.Plan(
        model=[plans.TableFingerprint("user", 100, 8, ("u",), data_type=data_type)],
        topology=plans.PlanTopology(world_size=2, local_world_size=2, device="cpu"),
        tables=[
            plans.TablePlan("user", "table_wise", "fused", [1], [plans.Shard(1, (0, 0), (100, 8))])
        ],
    )


def test_the_profiler_and_the_loader_read_a_tables_weight_type():
    assert [m.data_type for m in table_metas([("ebc", _model())])] == ["fp16"]
    assert [t.table.data_type for t in model_tables(_model())] == ["fp16"]
    assert [t.table.data_type for t in model_tables(_model(DataType.FP32))] == ["fp32"]


def test_a_plan_keeps_a_tables_weight_type_and_a_model_of_another_type_refuses_it(tmp_path):
    path = tmp_path / "plan.json"
    plans.save(_plan("fp16"), path)
    (table,) = json.loads(path.read_text())["model"]["tables"]
    assert table["data_type"] == "fp16"
    again = plans.load(path)
    again.check(_model(), 2)
    plans.save(_plan("fp32"), path)
    assert "data_type" not in json.loads(path.read_text())["model"]["tables"][0]  # the default
    with pytest.raises(
        plans.PlanError, match="table 'user' holds fp16 weights in the model, fp32 in the plan"
    ):
        plans.load(path).check(_model(), 2)
    assert "  model       1 tables, 1 of fp16 weights: user\n" in show(again)
    # half the bytes a rank holds
    assert rank_elements(_plan("fp16"))[1]["bytes"] == 100 * 8 * 2
    assert rank_elements(_plan("fp32"))[1]["bytes"] == 100 * 8 * 4


def test_an_unknown_weight_type_in_a_plan_file_is_refused_in_one_line(tmp_path):
    path = tmp_path / "plan.json"
    plans.save(_plan("fp16"), path)
    d = json.loads(path.read_text())
    d["model"]["tables"][0]["data_type"] = "fp12"
    path.write_text(json.dumps(d))
    with pytest.raises(plans.PlanError, match="data_type") as e:
        plans.load(path)
    assert "\n" not in str(e.value)


def test_the_memory_of_a_table_is_counted_in_its_weight_type():
    topo = preset("cpu-gloo", 2)
    model = CostModel(topo, 64, coefficients(topo))
    fp32 = TableStats("user", 100_000, 64, 2.0, feature_names=("u",))
    fp16 = dataclasses.replace(fp32, data_type="fp16")
    tw = OptionClass(TW, FUSED, 1)
    got = [model.terms(t, tw).own.ddr_bytes for t in (fp32, fp16)]
    state = 100_000 * 4  # row-wise Adagrad: one fp32 value a row, whatever the weights
    assert got == [100_000 * 64 * 4 + state, 100_000 * 64 * 2 + state]


def test_a_spec_table_of_fp16_weights_is_built_and_planned_so():
    d = load_workload("tiny").to_dict()
    d["tables"][0]["data_type"] = "fp16"
    spec = parse_workload(d, "spec.json")
    assert spec.tables[0].data_type == "fp16" and "data_type" not in spec.to_dict()["tables"][1]
    assert spec.fingerprints()[0]["data_type"] == "fp16"
    assert [s.data_type for s in stats_from_spec(spec)][:2] == ["fp16", "fp32"]
    model = build_model(spec, embedding_device=torch.device("cpu"))
    weights = {n: p.dtype for n, p in model.named_parameters() if "embedding_bags" in n}
    assert weights["model.sparse_arch.embedding_bag_collection.embedding_bags.t0.weight"] == (
        torch.float16
    )
    d["tables"][0]["data_type"] = "int8"
    with pytest.raises(UserError, match="table 't0': data_type 'int8' is not one of fp32, fp16"):
        parse_workload(d, "spec.json")


def test_profiles_of_a_table_in_two_weight_types_are_of_different_jobs(tmp_path):
    fixture = Path(__file__).parent / "fixtures" / "profile_tiny_table_wise"
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(fixture, a)
    shutil.copytree(fixture, b)
    check_same_job(a, b)  # the same job
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["tables"][0]["data_type"] = "fp16"
    (b / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match=r"table 't0': \(rows, dim, features, weights\)") as e:
        check_same_job(a, b)
    assert "'fp32') vs" in str(e.value) and "'fp16')" in str(e.value)


def test_the_plan_a_profile_ran_keeps_its_tables_weight_types():
    fixture = Path(__file__).parent / "fixtures" / "profile_tiny_table_wise"
    manifest = json.loads((fixture / "manifest.json").read_text())
    manifest["tables"][0]["data_type"] = "fp16"
    plan = plan_in_force(manifest)
    assert plan is not None  # what optimize keeps when nothing beats it: the model must take it
    assert [t.data_type for t in plan.model[:2]] == ["fp16", "fp32"]


def test_a_profiled_weight_type_sparselift_does_not_know_is_refused_naming_the_table(tmp_path):
    prof = tmp_path / "prof"
    shutil.copytree(Path(__file__).parent / "fixtures" / "profile_tiny_table_wise", prof)
    manifest = json.loads((prof / "manifest.json").read_text())
    manifest["tables"][3]["data_type"] = "fp4"
    (prof / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        UserError, match=r"table 't3' holds weights of type 'fp4', which SparseLift"
    ):
        stats_from_profile(prof)
