"""Plans with splits (format 2): the file, the checks, the batch transform, the split model, its
checkpoints, and real 2-rank gloo training that matches the unsplit plan's.

The 2-rank runs load this module in their ranks for `VirtualRun` (TrainConfig.hook).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from plans_helpers import DLRM_EBC, doc, model_tables, round_robin, write
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparselift import plans
from sparselift.plans import PlanError, PlanTopology, Shard, Split, TablePlan
from sparselift.plans.splits import part_names

HOT_ROWS = 1000  # t3's hottest rows (1 %) become its replicated hot part
LOSS_ATOL = 1e-5  # split vs unsplit losses, every one of 50 steps: float rounding only


def hot_ids_of_t3(n: int = HOT_ROWS) -> list[int]:
    """t3's n hottest rows as the synthetic batches draw them (popularity rank → row)."""
    from sparselift.workloads.batches import scatter_ids

    return scatter_ids(torch.arange(n), 100_000, salt=7919 * (3 + 1) + 0).tolist()


def tw(name: str, rank: int, rows: int, dim: int = 32) -> TablePlan:
    return TablePlan(name, "table_wise", "fused", [rank], [Shard(rank, (0, 0), (rows, dim))])


def reference_plan(world: int = 2) -> plans.Plan:
    """tiny round-robin table-wise, t7 column-wise in the blocks the split plan slices it into
    (row-wise Adagrad keeps one momentum per row and column block, so that is the same
    training as two column slices)."""
    p = round_robin(world)
    t7 = TablePlan(
        "t7",
        "column_wise",
        "fused",
        [1 % world, 0],
        [Shard(1 % world, (0, 0), (80_000, 16)), Shard(0, (0, 16), (80_000, 16))],
    )
    p.tables = [t7 if t.name == "t7" else t for t in p.tables]
    return plans.Plan.from_dict(p.to_dict())


def split_plan(world: int = 2, pipeline: str = "base") -> plans.Plan:
    """The reference plan with t3 hot/cold (hot part data-parallel), t5 in two row ranges and
    t7 in two column slices, each part table-wise."""
    p = reference_plan(world)
    r1 = 1 % world
    p.splits = [
        Split("t3", "hot_cold", part_names("t3", "hot_cold"), hot_ids=tuple(hot_ids_of_t3())),
        Split(
            "t5",
            "row_ranges",
            part_names("t5", "row_ranges", 2),
            ranges=((0, 20_000), (20_000, 50_000)),
        ),
        Split(
            "t7", "column_slices", part_names("t7", "column_slices", 2), ranges=((0, 16), (16, 32))
        ),
    ]
    parts = {
        "t3": [
            TablePlan("t3__hot", "data_parallel", "dense", list(range(world)), []),
            tw("t3__cold", r1, 100_000),
        ],
        "t5": [tw("t5__rows0", 0, 20_000), tw("t5__rows1", r1, 30_000)],
        "t7": [tw("t7__cols0", r1, 80_000, 16), tw("t7__cols1", 0, 80_000, 16)],
    }
    p.tables = [x for t in p.tables for x in parts.get(t.name, [t])]
    p.pipeline = pipeline
    return plans.Plan.from_dict(p.to_dict())


# ------------------------------------------------------------------------------- file format


def test_split_plans_are_version_2_and_round_trip(tmp_path):
    p = split_plan()
    plans.save(p, tmp_path / "s.json")
    back = plans.load(tmp_path / "s.json")
    assert back == p and back.splits == p.splits
    text = (tmp_path / "s.json").read_text()
    d = json.loads(text)
    assert d["version"] == 2 and list(d)[4:6] == ["splits", "tables"]
    assert [t["name"] for t in d["tables"]][3:5] == ["t3__hot", "t3__cold"]
    assert plans.dumps(back) == text.encode()
    # hot ids fill rows of the canonical width, not one id per line
    assert max(len(line) for line in text.splitlines()) <= 100
    assert len(text.splitlines()) < HOT_ROWS // 4
    assert [t.name for t in p.sharded_tables()][3:5] == ["t3__hot", "t3__cold"]
    from sparselift.plans.schema import _fast_check, _validator

    assert _fast_check()(d) and _validator().is_valid(d)  # the fast schema path takes splits


def test_plans_without_splits_stay_version_1_byte_for_byte(tmp_path):
    p = round_robin(2)
    data = plans.dumps(p)
    d = json.loads(data)
    assert d["version"] == 1 and "splits" not in d
    d["version"] = 1
    assert plans.dumps(plans.Plan.from_dict(d)) == data
    d["version"] = 2  # a version 2 file without splits reads, and is written as version 1
    assert plans.dumps(plans.Plan.from_dict(d)) == data


def test_splits_in_a_version_1_file_are_refused(tmp_path):
    d = doc(split_plan())
    d["version"] = 1
    with pytest.raises(PlanError, match="splits need plan format version 2, not 1"):
        plans.load(write(tmp_path / "v1.json", d))


def test_every_split_problem_is_listed():
    d = doc(split_plan())
    s3, s5, s7 = d["splits"]
    s3["hot_ids"] = s3["hot_ids"][:3] + [100_000, 100_001, s3["hot_ids"][0]]
    s5["row_ranges"] = [[0, 20_000], [20_001, 50_000]]
    s7["column_slices"] = [[0, 16], [16, 24]]
    d["splits"].append(
        {
            "table": "ghost",
            "kind": "row_ranges",
            "parts": ["g0", "g1"],
            "row_ranges": [[0, 1], [1, 2]],
        }
    )
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d, "p.json")
    assert e.value.problems == [
        "splits[0] ('t3'): hot ids 100000, 100001 are beyond its 100000 rows",
        f"splits[0] ('t3'): hot ids {s3['hot_ids'][0]} is named more than once",
        "splits[1] ('t5'): row ranges must cover rows 0..50000 in order: row range 1 leaves "
        "rows 20000..20001 uncovered",
        "splits[2] ('t7'): column slices cover columns 0..24 but the table has 32 columns",
        "splits[3] ('ghost'): 'ghost' is not a table of the model",
    ]
    assert str(e.value).count("\n") == 0


def test_split_names_and_entries_are_checked():
    d = doc(split_plan())
    d["splits"][1]["parts"] = ["t5__rows0", "t4"]  # a model table's name
    d["splits"][2]["parts"] = ["t7.a", "t7__cols1"]
    d["splits"][0]["row_ranges"] = [[0, 1]]
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d)
    assert e.value.problems == ["splits[0] ('t3'): hot_cold takes no row_ranges"]
    del d["splits"][0]["row_ranges"]
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d)
    msg = str(e.value)
    assert "splits[1] ('t5'): part 't4' is also a table of the model" in msg
    assert "splits[2] ('t7'): part 't7.a' contains '.', which TorchRec table names cannot" in msg
    d = doc(split_plan())
    d["tables"] = [t for t in d["tables"] if t["name"] != "t5__rows1"]
    d["tables"].append(dict(d["tables"][0], name="t3"))  # the split table itself
    rows0 = next(t for t in d["tables"] if t["name"] == "t5__rows0")
    rows0["shards"][0]["sizes"] = [50_000, 32]  # sized as the whole table
    with pytest.raises(PlanError) as e:
        plans.Plan.from_dict(d)
    assert e.value.problems == [
        "part 't5__rows1' of split table 't5' has no entry in tables",
        "tables: 't3' is split into virtual tables (t3__hot, t3__cold); they have entries, "
        "not the table",
        "table 't5__rows0': shard 0 rows 0..50000 × columns 0..32 exceeds the table (20000 × 32)",
        "table 't5__rows0': table_wise needs one shard of the whole table (20000 × 32)",
    ]


def test_a_model_that_breaks_a_split_is_refused_in_one_line():
    p = split_plan()
    tables = model_tables(p)
    by = {t["name"]: t for t in tables}
    by["t5"]["num_embeddings"] = 40_000
    by["t3"]["feature_names"] = ["t3_other"]
    by["t7"]["embedding_dim"] = 16
    with pytest.raises(PlanError) as e:
        p.check_spec(tables, 2)
    assert e.value.problems == [
        "table 't3' is split (hot_cold into t3__hot, t3__cold) by its features ['t3'], but the "
        "model feeds it ['t3_other']",
        "table 't5' has 40000 rows in the model, 50000 in the plan: its row range 20000..50000 "
        "(part 't5__rows1') lies beyond the model's rows",
        "table 't7' has dim 16 in the model, 32 in the plan: its column slice 16..32 (part "
        "'t7__cols1') lies beyond the model's 16 columns",
    ]
    assert "\n" not in str(e.value)


def test_train_refuses_a_split_plan_for_a_smaller_model_with_exit_2(tmp_path, cli):
    path = tmp_path / "s.json"
    plans.save(split_plan(), path)
    code, out, err = cli(
        "train",
        "--workload",
        "tiny",
        "--nproc",
        "2",
        "--plan",
        path,
        "--max-rows",
        "30000",
        "--device",
        "cpu",
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    lo = min(x for x in hot_ids_of_t3() if x >= 30_000)
    hi = max(hot_ids_of_t3())
    assert (
        f"table 't3' has 30000 rows in the model, 100000 in the plan: its hot ids {lo}..{hi} "
        f"(part 't3__hot') lie beyond the model's rows" in err
    )
    assert "its row range 20000..50000 (part 't5__rows1') lies beyond the model's rows" in err


# --------------------------------------------------------------------------- batch transform


def two_feature_plan() -> plans.Plan:
    """A small model: table "a" (fed by features x and y) in 3 row ranges, "b" hot/cold, "c"
    in column slices, "d" unsplit, "e" in 2 row ranges."""
    tables = [
        dict(name="a", num_embeddings=30, embedding_dim=4, feature_names=["x", "y"]),
        dict(name="b", num_embeddings=20, embedding_dim=4, feature_names=["b"]),
        dict(name="c", num_embeddings=10, embedding_dim=12, feature_names=["c"]),
        dict(name="d", num_embeddings=5, embedding_dim=4, feature_names=["d"]),
        dict(name="e", num_embeddings=12, embedding_dim=4, feature_names=["e"]),
    ]
    p = plans.round_robin_table_wise(tables, PlanTopology(1, 1, "cpu"))
    p.splits = [
        Split("a", "row_ranges", ("a0", "a1", "a2"), ranges=((0, 10), (10, 25), (25, 30))),
        Split("b", "hot_cold", ("bh", "bc"), hot_ids=(17, 3, 9)),
        Split("c", "column_slices", ("c0", "c1"), ranges=((0, 4), (4, 12))),
        Split("e", "row_ranges", ("e0", "e1"), ranges=((0, 5), (5, 12))),
    ]
    fps = {t.name: t for t in p.sharded_tables()}
    p.tables = [
        tw(n, 0, fps[n].num_embeddings, fps[n].embedding_dim)
        for n in ("a0", "a1", "a2", "bh", "bc", "c0", "c1", "d", "e0", "e1")
    ]
    return plans.Plan.from_dict(p.to_dict())


def naive_transform(
    plan: plans.Plan, feats: dict[str, list[list[int]]]
) -> dict[str, list[list[int]]]:
    """The transform written out id by id: what each virtual feature must receive."""
    out: dict[str, list[list[int]]] = {}
    splits = {s.table: s for s in plan.splits}
    for t in plan.model:
        s = splits.get(t.name)
        if s is None:
            out.update({f: feats[f] for f in t.feature_names})
            continue
        for i, part in enumerate(s.parts):
            for f in t.feature_names:
                bags = []
                for bag in feats[f]:
                    if s.kind == "column_slices":
                        bags.append(list(bag))
                    elif s.kind == "row_ranges":
                        a, b = s.ranges[i]
                        bags.append([x - a for x in bag if a <= x < b])
                    elif i == 0:
                        bags.append([s.hot_ids.index(x) for x in bag if x in s.hot_ids])
                    else:
                        bags.append([x for x in bag if x not in s.hot_ids])
                out[f"{f}/{part}"] = bags
    return out


def kjt_of(feats: dict[str, list[list[int]]], weighted: bool = False) -> KeyedJaggedTensor:
    keys = list(feats)
    values = [x for k in keys for bag in feats[k] for x in bag]
    lengths = [len(bag) for k in keys for bag in feats[k]]
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        weights=torch.arange(len(values), dtype=torch.float32) if weighted else None,
    )


def bags_of(kjt: KeyedJaggedTensor) -> dict[str, list[list[int]]]:
    return {k: [jt.tolist() for jt in kjt[k].to_dense()] for k in kjt.keys()}


def test_transform_remaps_every_id_exactly():
    p = two_feature_plan()
    gen = torch.Generator().manual_seed(3)
    feats = {
        f: [
            torch.randint(0, n, (int(k),), generator=gen).tolist()
            for k in torch.randint(0, 6, (7,), generator=gen)  # empty bags too
        ]
        for f, n in [("d", 5), ("y", 30), ("e", 12), ("c", 10), ("b", 20), ("x", 30)]
    }  # in another order than the plan's
    feats["b"][0] = [17, 3, 9, 17, 0]  # all hot ids, repeated, and a cold one
    out = p.transform_batch(kjt_of(feats))
    assert out.keys() == [
        "x/a0",
        "y/a0",
        "x/a1",
        "y/a1",
        "x/a2",
        "y/a2",
        "b/bh",
        "b/bc",
        "c/c0",
        "c/c1",
        "d",
        "e/e0",
        "e/e1",
    ]
    assert bags_of(out) == naive_transform(p, feats)
    assert out.stride() == 7  # every virtual feature keeps the batch's 7 bags
    k = kjt_of(feats)  # 32-bit ids and lengths stay 32-bit, same values
    k32 = KeyedJaggedTensor(keys=k.keys(), values=k.values().int(), lengths=k.lengths().int())
    out32 = p.transform_batch(k32)
    assert out32.values().dtype == out32.lengths().dtype == torch.int32
    assert bags_of(out32) == bags_of(out)
    # weights travel with their ids
    weighted = p.transform_batch(kjt_of(feats, weighted=True))
    ids = kjt_of(feats).values().tolist()
    by_weight = dict(zip(kjt_of(feats, weighted=True).weights().tolist(), ids, strict=True))
    got = weighted["b/bh"]
    assert [p.splits[1].hot_ids[v] for v in got.values().tolist()] == [
        by_weight[w] for w in got.weights().tolist()
    ]


def test_transform_of_a_batch_and_a_loader():
    from torchrec.datasets.utils import Batch

    p = two_feature_plan()
    feats = {f: [[1], [2, 3]] for f in ("x", "y", "b", "c", "d", "e")}
    batch = Batch(
        dense_features=torch.zeros(2, 1), sparse_features=kjt_of(feats), labels=torch.zeros(2)
    )
    out = p.transform_batch(batch)
    assert isinstance(out, Batch) and out.dense_features is batch.dense_features
    assert batch.sparse_features.keys() == list(feats)  # the input is left as it was
    assert [b.sparse_features.keys() for b in p.transform_loader([batch, batch])] == [
        out.sparse_features.keys()
    ] * 2
    assert round_robin(2).transform_batch(batch) is batch  # no splits: nothing to do


def test_transform_refuses_ids_beyond_the_table_and_missing_features():
    p = two_feature_plan()
    feats = {f: [[1], [2]] for f in ("x", "y", "b", "c", "d", "e")}
    feats["y"] = [[29, 31], [40]]
    with pytest.raises(
        PlanError,
        match=r"feature 'y' of split table 'a' has ids 31\.\.40 outside the table's rows 0\.\.29",
    ):
        p.transform_batch(kjt_of(feats))
    feats["y"] = [[-2], [1]]
    with pytest.raises(PlanError, match=r"feature 'y' of split table 'a' has ids -2\.\.-2"):
        p.transform_batch(kjt_of(feats))
    del feats["y"]
    with pytest.raises(PlanError, match="the batch lacks feature 'y' \\(table 'a'\\) of the plan"):
        p.transform_batch(kjt_of(feats))
    with pytest.raises(PlanError, match="cannot transform a list"):
        p.transform_batch([1, 2])


# --------------------------------------------------------------------------------- the model


def ebc_of(
    plan: plans.Plan,
    pooling: PoolingType = PoolingType.SUM,
    device: str = "cpu",
    optimizer: bool = True,
) -> EmbeddingBagCollection:
    """The plan's model tables as a collection, with row-wise Adagrad in backward (as the
    harness trains them) unless `optimizer` is False (then gradients stay on the weights)."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(**t, pooling=pooling) for t in model_tables(plan)],
        device=torch.device(device),
    )
    if optimizer:
        apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.02})
    return ebc


def random_feats(gen: torch.Generator, batch: int = 16) -> dict[str, list[list[int]]]:
    rows = {"x": 30, "y": 30, "b": 20, "c": 10, "d": 5, "e": 12}
    return {
        f: [
            torch.randint(0, n, (int(k),), generator=gen).tolist()
            for k in torch.randint(0, 5, (batch,), generator=gen)
        ]
        for f, n in rows.items()
    }


def test_split_model_pools_and_backpropagates_like_the_original():
    p = two_feature_plan()
    original = ebc_of(p, optimizer=False)
    split = p.rewrite(torch.nn.Sequential(original))[0]
    assert type(split).__name__ == "VirtualTables"
    assert [c.name for c in split.virtual.embedding_bag_configs()] == [
        t.name for t in p.sharded_tables()
    ]
    # the virtual weights carry the table's in-backward optimizer, for TorchRec to fuse
    fused = p.rewrite(torch.nn.Sequential(ebc_of(p, device="meta")))[0]
    assert fused.virtual.embedding_bags["bh"].weight._optimizer_kwargs == [{"lr": 0.02}]
    assert fused.virtual.embedding_bags["bh"].weight._optimizer_classes == [RowWiseAdagrad]
    kjt = kjt_of(random_feats(torch.Generator().manual_seed(5)))
    want = original(kjt)
    got = split(p.transform_batch(kjt))
    assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
    torch.testing.assert_close(got.values(), want.values(), rtol=0, atol=1e-6)
    g = torch.randn_like(want.values())
    (want.values() * g).sum().backward()
    (got.values() * g).sum().backward()
    grads = {
        f"embedding_bags.{n}.weight": m.weight.grad for n, m in split.virtual.embedding_bags.items()
    }
    back = p.to_original_state({f"virtual.{k}": v for k, v in grads.items()})
    for name, m in original.embedding_bags.items():
        torch.testing.assert_close(
            back[f"embedding_bags.{name}.weight"], m.weight.grad, rtol=0, atol=1e-6
        )


def test_an_untransformed_batch_is_refused_not_mislooked_up():
    p = two_feature_plan()
    split = p.rewrite(torch.nn.Sequential(ebc_of(p)))[0]
    kjt = kjt_of(random_feats(torch.Generator().manual_seed(1)))
    with pytest.raises(
        PlanError,
        match="the batch reaching the split model was not transformed .*'x/a0' of feature "
        "'x'.*plan.transform_batch",
    ):
        split(kjt)


def test_row_splits_need_sum_pooling_and_data_parallel_parts_row_wise_adagrad():
    p = two_feature_plan()
    with pytest.raises(PlanError) as e:
        p.rewrite(torch.nn.Sequential(ebc_of(p, PoolingType.MEAN, "meta")))
    assert e.value.problems == [
        "table 'a' pools by MEAN: a row_ranges split is exact only for SUM pooling (its parts' "
        "pooled embeddings are summed)",
        "table 'b' pools by MEAN: a hot_cold split is exact only for SUM pooling (its parts' "
        "pooled embeddings are summed)",
        "table 'e' pools by MEAN: a row_ranges split is exact only for SUM pooling (its parts' "
        "pooled embeddings are summed)",
    ]  # column slices of a MEAN table are exact: not refused
    p.tables = [
        TablePlan("bh", "data_parallel", "dense", [0], []) if t.name == "bh" else t
        for t in p.tables
    ]
    p = plans.Plan.from_dict(p.to_dict())
    bare = ebc_of(p, device="meta", optimizer=False)
    with pytest.raises(
        PlanError,
        match="part 'bh' is data_parallel, which SparseLift trains with the table's fused "
        "row-wise Adagrad, but it has no in-backward optimizer",
    ):
        p.rewrite(torch.nn.Sequential(bare))
    sgd = ebc_of(p, device="meta", optimizer=False)
    apply_optimizer_in_backward(torch.optim.SGD, sgd.parameters(), {"lr": 0.1})
    with pytest.raises(PlanError, match="but it trains with SGD"):
        p.rewrite(torch.nn.Sequential(sgd))


def test_checkpoints_convert_to_the_split_layout_and_back_bit_for_bit():
    p = split_plan()
    gen = torch.Generator().manual_seed(0)
    prefix = "model.sparse_arch.embedding_bag_collection."
    state = {
        f"{prefix}embedding_bags.{t.name}.weight": torch.randn(
            t.num_embeddings, t.embedding_dim, generator=gen
        )
        for t in p.model
    }
    state["model.dense_arch.weight"] = torch.randn(3, generator=gen)
    state[f"{prefix}embedding_bags.t3.weight"][5, 0] = -0.0  # signed zeros survive too
    blocks = {"t7": 2}  # t7 keeps one momentum per row and column block
    opt = {
        f"{prefix}embedding_bags.{t.name}.weight": {
            f"{t.name}.momentum1": torch.rand(
                t.num_embeddings * blocks.get(t.name, 1), generator=gen
            )
        }
        for t in p.model
    }
    virtual = p.to_virtual_state(state)
    assert (
        f"{prefix}virtual.embedding_bags.t3__hot.weight" in virtual
        and "model.dense_arch.weight" in virtual
    )
    hot = virtual[f"{prefix}virtual.embedding_bags.t3__hot.weight"]
    assert torch.equal(hot, state[f"{prefix}embedding_bags.t3.weight"][hot_ids_of_t3()])
    back = p.to_original_state(virtual)
    assert back.keys() == state.keys()
    for k, v in state.items():
        assert v.dtype == back[k].dtype and torch.equal(
            v.view(torch.int32), back[k].view(torch.int32)
        ), k
    vopt = p.to_virtual_optimizer_state(opt)
    assert vopt[f"{prefix}virtual.embedding_bags.t7__cols1.weight"][
        "t7__cols1.momentum1"
    ].shape == (80_000,)
    oback = p.to_original_optimizer_state(vopt)
    assert oback.keys() == opt.keys()
    for k, sub in opt.items():
        for n, v in sub.items():
            assert torch.equal(v.view(torch.int32), oback[k][n].view(torch.int32)), (k, n)
    with pytest.raises(
        PlanError, match="only row-wise Adagrad's t3.momentum1 converts across a split"
    ):
        p.to_virtual_optimizer_state(
            {f"{prefix}embedding_bags.t3.weight": {"t3.exp_avg": torch.zeros(1)}}
        )


def test_show_and_diff_name_the_splits():
    from sparselift.plans.render import diff, show

    text = show(split_plan())
    assert "t3: hot_cold: 1,000 hot rows in t3__hot, the rest in t3__cold" in text
    assert "t5: row_ranges: t5__rows0 rows 0-20000, t5__rows1 rows 20000-50000" in text
    lines = diff(reference_plan(), split_plan())
    assert "split t3: not split -> hot_cold (1,000 hot rows)" in lines
    assert "table t3__hot: only in B" in lines and "table t3: only in A" in lines


# ------------------------------------------------------------------------- 2-rank training


def _seeded(name: str, like: torch.Tensor, low: float, high: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.rand(like.shape, generator=gen, dtype=like.dtype) * (high - low) + low


class VirtualRun:
    """Harness hook: load one seeded checkpoint in the original layout (converted for a split
    plan), record every step's loss, check the checkpoint round trip, save the final state."""

    def __init__(self, ctx: Any, out: str) -> None:
        from sparselift.plans import checkpoint as ck

        self.ctx, self.out, self.losses = ctx, out, []
        plan, model = ctx.plan, ctx.model
        optimizer = model.fused_optimizer
        state, opt = ck.full_state(model), ck.full_optimizer_state(optimizer)
        if plan.splits:  # the original layout's names and sizes, from the split model's
            state, opt = plan.to_original_state(state), plan.to_original_optimizer_state(opt)
        self.checkpoint = {k: _seeded(k, v, -0.05, 0.05) for k, v in state.items()}
        self.opt_checkpoint = {
            k: {n: _seeded(k + n, v, 0.0, 0.01) for n, v in sub.items()} for k, sub in opt.items()
        }
        load, load_opt = self.checkpoint, self.opt_checkpoint
        if plan.splits:
            load, load_opt = plan.to_virtual_state(load), plan.to_virtual_optimizer_state(load_opt)
        ck.load_full_state(model, load)
        ck.load_full_optimizer_state(optimizer, load_opt)
        self.roundtrip = None
        if plan.splits:  # … and back, bit for bit
            back = plan.to_original_state(ck.full_state(model))
            oback = plan.to_original_optimizer_state(ck.full_optimizer_state(optimizer))
            self.roundtrip = {
                "weights": back.keys() == self.checkpoint.keys()
                and all(
                    torch.equal(v.view(torch.int32), back[k].view(torch.int32))
                    for k, v in self.checkpoint.items()
                ),
                "optimizer": oback.keys() == self.opt_checkpoint.keys()
                and all(
                    torch.equal(v, oback[k][n])
                    for k, sub in self.opt_checkpoint.items()
                    for n, v in sub.items()
                ),
                "tables": sorted(k for k in self.checkpoint if ".embedding_bags." in k),
                "optimizer_tables": sorted(self.opt_checkpoint),
            }
        model.register_forward_hook(lambda m, args, out: self.losses.append(float(out[0].detach())))

    def step_begin(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def finish(self) -> dict[str, Any]:
        from torchrec.distributed.types import ShardedModule

        from sparselift.plans import checkpoint as ck

        plan, model = self.ctx.plan, self.ctx.model
        state = ck.full_state(model)
        opt = ck.full_optimizer_state(model.fused_optimizer)
        if plan.splits:
            state, opt = plan.to_original_state(state), plan.to_original_optimizer_state(opt)
        if self.ctx.rank == 0:
            torch.save({"state": state, "opt": opt}, Path(self.out, "final.pt"))
        dense = self.ctx.pipeline._optimizer.optimizers[1][1]  # harness: [fused, dense]
        return {
            "losses": self.losses,
            "roundtrip": self.roundtrip,
            "pipelined": sorted(
                n.removeprefix("_dmp_wrapped_module.").removeprefix("module.")
                for n, m in model.named_modules()
                if isinstance(m, ShardedModule) and getattr(m, "is_pipelined", False)
            ),
            "hot_in_dense_optimizer": [k for k in dense.params if "__hot" in k],
        }


def virtual_run(ctx: Any, out: str) -> VirtualRun:
    return VirtualRun(ctx, out)


def _train(tmp_path: Path, plan: plans.Plan, name: str, pipeline: str) -> tuple[Any, dict]:
    from sparselift.workloads.harness import TrainConfig, run_training

    path = tmp_path / f"{name}.json"
    plans.save(plan, path)
    out = tmp_path / name
    out.mkdir()
    result = run_training(
        TrainConfig(
            workload="tiny",
            nproc=2,
            steps=50,
            warmup=0,
            plan=str(path),
            pipeline=pipeline,
            device="cpu",
            seed=7,
            hook="test_plans_virtual:virtual_run",
            hook_args={"out": str(out)},
        )
    )
    return result, torch.load(out / "final.pt")


@pytest.mark.slow
def test_split_plan_trains_like_the_unsplit_plan_on_two_ranks(tmp_path):
    ref, ref_final = _train(tmp_path, reference_plan(), "reference", "base")
    got, got_final = _train(tmp_path, split_plan(), "split", "sparse-dist")
    assert got.pipeline == "sparse-dist"
    for r_ref, r_got in zip(ref.ranks, got.ranks, strict=True):
        a, b = r_ref.extra["losses"], r_got.extra["losses"]
        assert len(a) == len(b) == 50
        diff = max(abs(x - y) for x, y in zip(a, b, strict=True))
        print(
            f"rank {r_ref.rank}: max |loss difference| over 50 steps {diff:.3g}; "
            f"loss {a[0]:.5f} -> {a[-1]:.5f}"
        )
        assert diff <= LOSS_ATOL, (a, b)
        assert a[0] != a[-1]  # it trained
        # the round trip covered every table of the model, split or not, weights and momentum
        tables = sorted(f"{DLRM_EBC}.embedding_bags.{t.name}.weight" for t in split_plan().model)
        assert r_got.extra["roundtrip"] == {
            "weights": True,
            "optimizer": True,
            "tables": tables,
            "optimizer_tables": tables,
        }
        # TrainPipelineSparseDist pipelines the split model's input distribution
        assert r_got.extra["pipelined"] == ["model.sparse_arch.embedding_bag_collection.virtual"]
        assert r_got.extra["hot_in_dense_optimizer"] == []
    # after 50 steps the tables (and their momentum) are the same too, in the original layout
    worst = 0.0
    for k, v in ref_final["state"].items():
        worst = max(worst, float((v - got_final["state"][k]).abs().max()))
    print(f"max |weight difference| after 50 steps {worst:.3g}")
    assert worst <= 1e-4
    for k, sub in ref_final["opt"].items():
        for n, v in sub.items():
            torch.testing.assert_close(got_final["opt"][k][n], v, rtol=1e-4, atol=1e-6)


USER_TRAINER = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from sparselift import plans
    from sparselift.plans import PlanError
    from sparselift.workloads.batches import SyntheticBatches
    from sparselift.workloads.sharding import build_optimizer, make_pipeline, shard
    from sparselift.workloads.spec import load_workload

    address = "tcp://127.0.0.1:" + sys.argv[2]
    dist.init_process_group("gloo", init_method=address, rank=0, world_size=1)
    plan = plans.load(sys.argv[1])
    spec = load_workload("tiny")
    out = {}
    for pipeline in ("base", "sparse-dist"):
        model = shard(spec, dist.GroupMember.WORLD, torch.device("cpu"), plan=plan)
        pipe = make_pipeline(pipeline, model, build_optimizer(model), torch.device("cpu"))
        batches = iter(SyntheticBatches(spec, seed=1))
        try:
            pipe.progress(batches)  # not transformed
            out[pipeline] = None
        except PlanError as e:
            out[pipeline] = str(e)
        model = shard(spec, dist.GroupMember.WORLD, torch.device("cpu"), plan=plan)
        pipe = make_pipeline(pipeline, model, build_optimizer(model), torch.device("cpu"))
        loader = plan.transform_loader(SyntheticBatches(spec, seed=1))
        out[pipeline + " transformed"] = [float(pipe.progress(loader)[0]) for _ in range(3)]
    print(json.dumps(out))
    sys.stdout.flush(); os._exit(0)
""")


def run_json(args: list[str], timeout: int) -> Any:
    """`python *args` from the repository root: the JSON on the last line it prints (the test
    fails with its stderr's tail where it exits non-zero)."""
    run = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).parent.parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_trainer_that_forgets_the_transform_fails_at_the_first_step(tmp_path):
    import socket

    path = tmp_path / "s1.json"
    plans.save(split_plan(world=1), path)
    script = tmp_path / "trainer.py"
    script.write_text(USER_TRAINER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = run_json([str(script), str(path), str(port)], timeout=300)
    for pipeline in ("base", "sparse-dist"):
        assert (
            got[pipeline] is not None
            and "the batch reaching the split model was not transformed" in got[pipeline]
        )
        assert "plan.transform_batch(batch)" in got[pipeline]
        losses = got[pipeline + " transformed"]
        assert len(losses) == 3 and all(math.isfinite(x) for x in losses)


ISOLATION = r"""
import sys, json
import torch
from torch import nn
import sparselift.plans as plans
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
p = plans.load(sys.argv[1])
model = nn.Module()
model.ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(
    name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
    feature_names=list(t.feature_names)) for t in p.model], device=torch.device("meta"))
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": 0.02})
p.check(model, 2)
p.rewrite(model)
p.check(model, 2)  # the split model still checks as the original
keys = sorted(p.sharding_plan(model).plan)
options = p.plan_loader(model).load()
kjt = KeyedJaggedTensor(keys=[f for t in p.model for f in t.feature_names],
                        values=torch.zeros(len(p.model), dtype=torch.int64),
                        lengths=torch.ones(len(p.model), dtype=torch.int64))
out = p.transform_batch(kjt)
ours = sorted(m for m in sys.modules
              if m.startswith("sparselift.") and not m.startswith("sparselift.plans"))
bad = sorted(m for m in ("pandas", "ortools", "holoviews", "bokeh") if m in sys.modules)
print(json.dumps({"ours": ours, "bad": bad, "keys": keys, "options": len(options),
                  "features": len(out.keys())}))
"""


@pytest.mark.slow
def test_split_plans_load_and_apply_with_stdlib_torch_torchrec_only(tmp_path):
    path = tmp_path / "s.json"
    plans.save(split_plan(), path)
    got = run_json(["-c", ISOLATION, str(path)], timeout=120)
    assert got == {"ours": [], "bad": [], "keys": ["ebc.virtual"], "options": 11, "features": 11}
