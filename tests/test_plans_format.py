"""Plan files: round trip, deterministic bytes, schema and consistency refusals, speed, imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_input_cases import field_paths
from plans_helpers import big_plan, doc, mixed, round_robin, tiny_tables, write

from sparselift import plans
from sparselift.plans import PlanError


def test_round_trip_every_sharding_type(tmp_path):
    for p in (round_robin(2), mixed("fp16", "sparse-dist")):
        plans.save(p, tmp_path / "p.json")
        back = plans.load(tmp_path / "p.json")
        assert back == p
        assert plans.Plan.from_dict(back.to_dict()) == p
        assert back.source == str(tmp_path / "p.json")


def test_save_is_byte_identical_and_canonical(tmp_path):
    p = mixed()
    plans.save(p, tmp_path / "a.json")
    plans.save(plans.load(tmp_path / "a.json"), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    # Same plan with free-form keys in another order and float noise: same bytes.
    q = mixed()
    q.provenance = {"a": {"b": [1, 2], "y": 2.0}, "z": 1}
    q.predicted["step_time_s"] = 0.0123456789012 + 1e-16
    q.tables = list(reversed(q.tables))  # tables are written in model order
    assert plans.dumps(q) == (tmp_path / "a.json").read_bytes()
    text = (tmp_path / "a.json").read_text()
    assert text.endswith("}\n") and '"step_time_s": 0.0123456789' in text
    assert list(json.loads(text)) == [
        "format",
        "version",
        "model",
        "topology",
        "tables",
        "comm_precision",
        "pipeline",
        "predicted",
        "solver",
        "provenance",
    ]


def test_save_is_atomic_and_refuses_invalid_plans(tmp_path):
    p = round_robin(2)
    p.tables[0].ranks = [7]
    with pytest.raises(PlanError, match="rank 7"):
        plans.save(p, tmp_path / "bad.json")
    assert list(tmp_path.iterdir()) == []
    plans.save(round_robin(2), tmp_path / "ok.json")
    assert [f.name for f in tmp_path.iterdir()] == ["ok.json"]
    # the usual file mode (not the temp file's 0600): a trainer running as another user reads it
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "ok.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_plan_error_is_user_error():
    assert issubclass(PlanError, ValueError) and PlanError.is_user_error is True


def test_malformed_json_wrong_format_newer_version(tmp_path):
    with pytest.raises(PlanError, match=r"bad\.json: malformed JSON at line 1"):
        plans.load(write(tmp_path / "bad.json", '{"format": "sparselift-plan",'))
    d = doc(round_robin())
    d["format"] = "something-else"
    with pytest.raises(PlanError, match="not a SparseLift plan"):
        plans.load(write(tmp_path / "f.json", d))
    d = doc(round_robin())
    d["version"] = 3
    with pytest.raises(PlanError, match="version 3 is newer than this SparseLift reads"):
        plans.load(write(tmp_path / "v.json", d))
    with pytest.raises(PlanError, match="cannot read"):
        plans.load(tmp_path / "missing.json")


def test_schema_violations_are_all_listed(tmp_path):
    d = doc(round_robin())
    d["tables"][1]["sharding_type"] = "diagonal"
    d["tables"][2]["ranks"] = [-1]
    d["pipeline"] = "turbo"
    del d["topology"]["device"]
    with pytest.raises(PlanError) as e:
        plans.load(write(tmp_path / "s.json", d))
    msg = str(e.value)
    assert msg.startswith(str(tmp_path / "s.json") + ": ")
    assert "tables[1] ('t1').sharding_type: 'diagonal' is not one of" in msg
    assert "tables[2] ('t2').ranks[0]: -1 is less than the minimum of 0" in msg
    assert "pipeline: 'turbo' is not one of" in msg
    assert "'device' is a required property" in msg
    assert len(e.value.problems) == 4


def test_a_trainer_without_jsonschema_still_refuses_a_bad_plan(tmp_path, monkeypatch):
    from sparselift.plans import schema

    d = doc(round_robin())
    d["pipeline"] = "turbo"
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema now raises ImportError
    schema._validator.cache_clear()
    try:
        with pytest.raises(PlanError, match="does not match plan.schema.json"):
            plans.load(write(tmp_path / "s.json", d))
        assert plans.load(write(tmp_path / "ok.json", doc(round_robin()))).pipeline == "base"
    finally:
        schema._validator.cache_clear()


def test_consistency_problems_are_all_listed():
    d = doc(mixed())
    t = {x["name"]: x for x in d["tables"]}
    t["t1"]["ranks"] = [5]
    t["t1"]["shards"][0]["rank"] = 5  # rank out of range
    t["t2"]["shards"][1]["offsets"] = [10001, 0]  # row gap
    t["t2"]["shards"][1]["sizes"] = [9999, 32]
    t["t3"]["shards"][1]["sizes"] = [100000, 8]  # columns not covered
    t["t6"]["shards"][0]["sizes"] = [200, 32]  # table-wise shard not the whole table
    t["t0"]["compute_kernel"] = "fused"  # data parallel needs dense
    t["t7"]["compute_kernel"] = "fused_uvm"  # no UVM on cpu
    t["t4"]["shards"][0]["sizes"] = [1500, 32]  # overlap
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d, "x.json")
    msg = str(e.value)
    for expected in (
        "table 't1': rank 5 is out of range for world_size 2",
        "table 't2': row_wise shards must cover rows 0..20000 in order: shard 1 starts at 10001, "
        "leaves rows 10000..10001 uncovered",
        "table 't3': column_wise shards cover columns 0..24 but the table has 32 columns",
        "table 't6': table_wise needs one shard of the whole table (300 × 32)",
        "table 't0': data_parallel needs compute_kernel 'dense'",
        "table 't7': compute_kernel 'fused_uvm' is not offered for table_wise on cpu",
        "table 't4': table_row_wise shards must cover rows 0..2000 in order: "
        "shard 1 starts at 1000, "
        "overlaps the previous shard",
    ):
        assert expected in msg, msg


def test_a_shard_of_columns_fbgemm_cannot_run_is_refused():
    d = doc(mixed())
    t3 = next(x for x in d["tables"] if x["name"] == "t3")
    assert [s["sizes"][1] for s in t3["shards"]] == [16, 16]
    t3["shards"][0]["sizes"][1] = 14
    t3["shards"][1]["offsets"][1], t3["shards"][1]["sizes"][1] = 14, 18
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d, "x.json")
    assert e.value.problems == [
        "table 't3': shard 0 has 14 columns: FBGEMM's kernels need a multiple of 4 (TorchRec "
        "would refuse it when sharding)",
        "table 't3': shard 1 has 18 columns: FBGEMM's kernels need a multiple of 4 (TorchRec "
        "would refuse it when sharding)",
    ]


def test_model_and_tables_must_agree():
    d = doc(round_robin())
    d["tables"] = [x for x in d["tables"] if x["name"] != "t3"]
    d["tables"].append(dict(d["tables"][0], name="ghost"))
    d["topology"]["local_world_size"] = 3
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d)
    assert e.value.problems == [
        "topology: local_world_size 3 does not divide world_size 2",
        "table 't3' of the model has no entry in tables",
        "tables: 'ghost' is not a table of the model",
    ]


def test_check_spec_lists_every_mismatch():
    p = round_robin(2)
    tables = tiny_tables()
    tables = [t for t in tables if t["name"] != "t1"]  # missing from the model
    tables.append(
        dict(name="t9", num_embeddings=10, embedding_dim=32, feature_names=["t9"])
    )  # extra
    tables[0]["num_embeddings"] = 999  # resized rows
    tables[1]["embedding_dim"] = 16  # resized dim
    tables[2]["feature_names"] = ["other"]
    with pytest.raises(PlanError) as e:
        p.check_spec(tables, 4)
    assert e.value.problems == [
        "plan is for world_size 2, this job has 4 ranks",
        "table 't9' is in the model but not in the plan",
        "table 't1' is in the plan but not in the model",
        "table 't0' has 999 rows in the model, 1000 in the plan",
        "table 't2' has dim 16 in the model, 32 in the plan",
        "table 't3' is fed features ['other'] in the model, ['t3'] in the plan",
    ]
    p.check_spec(tiny_tables(), 2)  # the right model passes


def test_loading_a_1000_table_plan_is_fast(tmp_path):
    path = tmp_path / "big.json"
    plans.save(big_plan(1000), path)
    plans.load(path)  # warm the schema validator once, as a process loading its plan would
    t0 = time.perf_counter()
    p = plans.load(path)
    elapsed = time.perf_counter() - t0
    assert len(p.tables) == 1000
    assert elapsed < 1.0, f"loading 1000 tables took {elapsed:.2f} s"


ISOLATION = r"""
import sys, json
import torch
from torch import nn
import sparselift.plans as plans
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
p = plans.load(sys.argv[1])
sp = p.sharding_plan()
class Wrapper(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Module()
        self.inner.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
            name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
            feature_names=list(t.feature_names)) for t in p.model], device=torch.device("meta"))
model = Wrapper()
p.check(model, 2)
sp2 = p.sharding_plan(model)
p.sharders(); p.pipeline_class(); p.plan_loader(model).load()
bad = sorted(m for m in ("pandas", "ortools", "holoviews", "bokeh") if m in sys.modules)
ours = sorted(m for m in sys.modules
              if m.startswith("sparselift.") and not m.startswith("sparselift.plans"))
print(json.dumps({"bad": bad, "ours": ours, "keys": sorted(sp.plan), "keys2": sorted(sp2.plan)}))
"""


@pytest.mark.slow
def test_plans_import_only_stdlib_torch_torchrec_jsonschema(tmp_path):
    path = tmp_path / "p.json"
    plans.save(mixed("fp16"), path)
    out = subprocess.run(
        [sys.executable, "-c", ISOLATION, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {
        "bad": [],
        "ours": [],
        "keys": ["model.sparse_arch.embedding_bag_collection"],
        "keys2": ["inner.ebc"],
    }


def test_fast_schema_check_never_accepts_what_jsonschema_rejects():
    import copy
    import random

    from sparselift.plans.schema import _fast_check, _validator

    base = doc(mixed("fp16"))
    assert _fast_check()(base) and _validator().is_valid(base)
    rng = random.Random(0)
    values = [-1, 0, 1, 2.5, "x", "", None, True, [], {}, [1], {"a": 1}, "table_wise", 1e9]
    paths = [p for p in field_paths(base) if p]
    accepted = 0
    for _ in range(3000):
        d = copy.deepcopy(base)
        path = rng.choice(paths)
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        action = rng.random()
        if action < 0.2 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.3 and isinstance(parent, dict):
            parent["unexpected"] = 1
        else:
            parent[path[-1]] = rng.choice(values)
        if _fast_check()(d):  # may decline more (e.g. 1e9 as an integer); must never accept more
            assert _validator().is_valid(d), (path, action)
            accepted += 1
    assert accepted > 100  # mutations that stay valid (other names, sizes) do take the fast path


def test_integral_floats_become_ints():
    d = doc(round_robin(2))
    d["tables"][1]["ranks"] = [1.0]
    d["tables"][1]["shards"][0]["sizes"] = [5000.0, 32]
    p = plans.Plan.from_dict(d)
    assert p.tables[1].ranks == [1] and type(p.tables[1].shards[0].sizes[0]) is int
