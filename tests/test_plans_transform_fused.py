"""The batch transform (`sparselift.plans.transform.BatchTransform`) against a per-bag reference.

The reference below routes every id of every bag in plain Python, straight from what the split
kinds mean (`Split`'s docstring); the transform must produce the very same KJT: keys, values,
lengths and weights, value for value and dtype for dtype, for random models that mix every split
kind with unsplit tables, features in any input order, empty bags and empty features, 32- and
64-bit ids and lengths, with and without weights, and with the hot/cold lookup done by table or
by binary search. Bad ids must be refused with the message naming the first bad split feature in
model order.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparselift.plans import PlanError, Split, routing
from sparselift.plans.splits import part_names, virtual_feature
from sparselift.plans.transform import BatchTransform
from sparselift.plans.types import TableFingerprint

Bags = list[list[Any]]


# ------------------------------------------------------------------------------ the reference


def reference(
    model: list[TableFingerprint],
    splits: list[Split],
    keys: list[str],
    ids: dict[str, Bags],
    weights: dict[str, Bags] | None,
) -> tuple[list[str], dict[str, Bags], dict[str, Bags] | None]:
    """Output keys, and each output feature's bags of ids (and of weights), bag by bag."""
    by_table = {s.table: s for s in splits}
    out_keys: list[str] = []
    out_ids: dict[str, Bags] = {}
    out_w: dict[str, Bags] | None = {} if weights is not None else None
    for t in model:
        s = by_table.get(t.name)
        if s is None:
            for f in t.feature_names:
                out_keys.append(f)
                out_ids[f] = ids[f]
                if out_w is not None and weights is not None:
                    out_w[f] = weights[f]
            continue
        for p, part in enumerate(s.parts):
            for f in t.feature_names:
                key = virtual_feature(f, part)
                out_keys.append(key)
                bags_i: Bags = []
                bags_w: Bags = []
                for b, bag in enumerate(ids[f]):
                    wbag = weights[f][b] if weights is not None else [None] * len(bag)
                    got_i, got_w = [], []
                    for x, w in zip(bag, wbag, strict=True):
                        y = route_one(s, p, x)
                        if y is not None:
                            got_i.append(y)
                            got_w.append(w)
                    bags_i.append(got_i)
                    bags_w.append(got_w)
                out_ids[key] = bags_i
                if out_w is not None:
                    out_w[key] = bags_w
    named = {f for t in model for f in t.feature_names}
    for k in keys:
        if k not in named:
            out_keys.append(k)
            out_ids[k] = ids[k]
            if out_w is not None and weights is not None:
                out_w[k] = weights[k]
    return out_keys, out_ids, out_w


def route_one(s: Split, part: int, x: int) -> int | None:
    """Where id `x` of split `s`'s table goes in part `part`: its row there, or None."""
    if s.kind == "column_slices":
        return x
    if s.kind == "row_ranges":
        a, b = s.ranges[part]
        return x - a if a <= x < b else None
    hot = x in s.hot_ids
    if part == 0:
        return s.hot_ids.index(x) if hot else None
    return None if hot else x


def reference_error(
    model: list[TableFingerprint], splits: list[Split], ids: dict[str, Bags]
) -> str | None:
    """The message for the first split feature (model order) with ids outside its table."""
    by_table = {s.table for s in splits}
    for t in model:
        if t.name not in by_table:
            continue
        for f in t.feature_names:
            bad = [x for bag in ids[f] for x in bag if not 0 <= x < t.num_embeddings]
            if bad:
                return (
                    f"feature {f!r} of split table {t.name!r} has ids {min(bad)}..{max(bad)} "
                    f"outside the table's rows 0..{t.num_embeddings - 1}"
                )
    return None


# ------------------------------------------------------------------------- random cases


def random_case(rng: random.Random) -> tuple[list[TableFingerprint], list[Split]]:
    """A model of 3-7 tables (1-3 features each), each table split by a random kind or not."""
    model, splits = [], []
    for ti in range(rng.randint(3, 7)):
        name = f"t{ti}"
        rows = rng.choice([1, 2, 3, 7, 20, 50, 300])
        dim = rng.choice([2, 4, 8])
        feats = tuple(f"{name}_f{j}" for j in range(rng.randint(1, 3)))
        model.append(TableFingerprint(name, rows, dim, feats))
        kind = rng.choice(["hot_cold", "row_ranges", "column_slices", None, None])
        if kind == "hot_cold" and rows >= 2:
            hot = rng.sample(range(rows), rng.randint(1, rows - 1))  # in any order
            splits.append(Split(name, kind, part_names(name, kind), hot_ids=tuple(hot)))
        elif kind == "row_ranges" and rows >= 2:
            n = rng.randint(2, min(4, rows))
            cuts = sorted(rng.sample(range(1, rows), n - 1))
            ranges = tuple(zip([0, *cuts], [*cuts, rows], strict=True))
            splits.append(Split(name, kind, part_names(name, kind, n), ranges=ranges))
        elif kind == "column_slices":
            n = rng.randint(2, min(3, dim))
            cuts = sorted(rng.sample(range(1, dim), n - 1))
            ranges = tuple(zip([0, *cuts], [*cuts, dim], strict=True))
            splits.append(Split(name, kind, part_names(name, kind, n), ranges=ranges))
    return model, splits


def random_batch(
    rng: random.Random, model: list[TableFingerprint], batch: int, weighted: bool
) -> tuple[list[str], dict[str, Bags], dict[str, Bags] | None]:
    """Every model feature plus 0-2 features the plan does not name, in a random order; bags of
    0-5 ids, some features with no ids at all."""
    rows = {f: t.num_embeddings for t in model for f in t.feature_names}
    rows.update({f"extra{i}": 1000 for i in range(rng.randint(0, 2))})
    keys = list(rows)
    rng.shuffle(keys)
    ids: dict[str, Bags] = {}
    for k in keys:
        empty = rng.random() < 0.15
        ids[k] = [
            [rng.randrange(rows[k]) for _ in range(0 if empty else rng.randint(0, 5))]
            for _ in range(batch)
        ]
    if not weighted:
        return keys, ids, None
    weights = {k: [[rng.random() for _ in bag] for bag in ids[k]] for k in keys}
    return keys, ids, weights


def kjt_of(
    keys: list[str],
    ids: dict[str, Bags],
    weights: dict[str, Bags] | None,
    id_dtype: torch.dtype,
    len_dtype: torch.dtype,
    w_dtype: torch.dtype = torch.float32,
) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=keys,
        values=torch.tensor([x for k in keys for b in ids[k] for x in b], dtype=id_dtype),
        lengths=torch.tensor([len(b) for k in keys for b in ids[k]], dtype=len_dtype),
        weights=(
            torch.tensor([w for k in keys for b in weights[k] for w in b], dtype=w_dtype)
            if weights is not None
            else None
        ),
        stride=len(ids[keys[0]]),
    )


def assert_matches_reference(
    out: KeyedJaggedTensor,
    inp: KeyedJaggedTensor,
    want: tuple[list[str], dict[str, Bags], dict[str, Bags] | None],
) -> None:
    keys, ids, weights = want
    assert out.keys() == keys
    assert out.stride() == inp.stride()
    assert out.values().dtype == inp.values().dtype
    assert out.lengths().dtype == inp.lengths().dtype
    assert out.values().tolist() == [x for k in keys for b in ids[k] for x in b]
    assert out.lengths().tolist() == [len(b) for k in keys for b in ids[k]]
    if weights is None:
        assert out.weights_or_none() is None
    else:
        assert out.weights().dtype == inp.weights().dtype
        # the very weights of the input, in the routed ids' order
        flat = [w for k in keys for b in weights[k] for w in b]
        flat = torch.tensor(flat, dtype=inp.weights().dtype)
        assert torch.equal(out.weights(), flat)


# -------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize(
    "max_rows", [None, 0, 20, "int64"], ids=["lookup-table", "search", "both", "int64-codes"]
)
def test_transform_equals_the_per_bag_reference(seed, max_rows, monkeypatch):
    if max_rows == "int64":  # codes (and the partition's positions) past 32 bits: 64-bit
        monkeypatch.setattr(routing, "INT32_CODES", 0)
    elif max_rows is not None:  # split tables of more rows are searched or compared
        monkeypatch.setattr(routing, "LOOKUP_TABLE_MAX_ROWS", max_rows)
    rng = random.Random(seed)
    model, splits = random_case(rng)
    transform = BatchTransform(model, splits, "test")
    for trial in range(5):  # one transform, several batches and key orders
        weighted = trial in (1, 3, 4)
        id_dtype = torch.int32 if trial in (1, 2) else torch.int64
        len_dtype = torch.int32 if trial in (2, 3) else torch.int64
        w_dtype = torch.float64 if trial == 4 else torch.float32
        keys, ids, weights = random_batch(rng, model, rng.randint(1, 6), weighted)
        inp = kjt_of(keys, ids, weights, id_dtype, len_dtype, w_dtype)
        out = transform(inp)
        assert_matches_reference(out, inp, reference(model, splits, keys, ids, weights))


def test_every_kind_with_all_hot_none_hot_and_empty_batches():
    model = [
        TableFingerprint("h", 6, 4, ("h1", "h2")),
        TableFingerprint("r", 10, 4, ("r1",)),
        TableFingerprint("u", 5, 4, ("u1",)),
        TableFingerprint("c", 4, 4, ("c1", "c2")),
        TableFingerprint("r3", 9, 4, ("r3",)),
    ]
    splits = [
        Split("h", "hot_cold", part_names("h", "hot_cold"), hot_ids=(5, 0, 3)),
        Split("r", "row_ranges", part_names("r", "row_ranges"), ranges=((0, 4), (4, 10))),
        Split("c", "column_slices", part_names("c", "column_slices"), ranges=((0, 1), (1, 4))),
        Split("r3", "row_ranges", part_names("r3", "row_ranges", 3),
              ranges=((0, 2), (2, 3), (3, 9))),
    ]  # fmt: skip
    transform = BatchTransform(model, splits, "test")
    keys = ["c2", "u1", "r3", "h2", "r1", "c1", "h1"]
    cases: list[dict[str, Bags]] = [
        {k: [[], []] for k in keys},  # no ids at all
        {**{k: [[0], [1, 1]] for k in keys}, "h1": [[5, 0, 3], [3]], "h2": [[1, 2], [4]]},
        {**{k: [[2, 3, 0], []] for k in keys}, "r1": [[9, 4], [0, 3]], "r3": [[8, 2, 1, 0], []]},
    ]
    for ids in cases:
        for weighted in (False, True):
            w = {k: [[0.5 + x for x in b] for b in ids[k]] for k in keys} if weighted else None
            inp = kjt_of(keys, ids, w, torch.int64, torch.int64)
            assert_matches_reference(transform(inp), inp, reference(model, splits, keys, ids, w))


@pytest.mark.parametrize("seed", range(6))
def test_bad_ids_are_refused_naming_the_first_bad_split_feature(seed):
    rng = random.Random(100 + seed)
    model, splits = random_case(rng)
    if not splits:
        splits = [Split(model[0].name, "column_slices", ("p0", "p1"), ranges=((0, 1), (1, 2)))]
        model[0] = TableFingerprint(
            model[0].name, model[0].num_embeddings, 2, model[0].feature_names
        )
    transform = BatchTransform(model, splits, "test")
    keys, ids, _ = random_batch(rng, model, 3, weighted=False)
    split_tables = {s.table for s in splits}
    split_feats = [f for t in model if t.name in split_tables for f in t.feature_names]
    for f in rng.sample(split_feats, rng.randint(1, len(split_feats))):
        rows = next(t.num_embeddings for t in model if f in t.feature_names)
        ids[f][rng.randrange(3)].append(rng.choice([-1, -7, rows, rows + 5, 10**6]))
    extra = [k for k in keys if k.startswith("extra")]
    if extra:  # an unsplit feature's ids are not the transform's business
        ids[extra[0]][0].append(-3)
    message = reference_error(model, splits, ids)
    assert message is not None
    with pytest.raises(PlanError) as e:
        transform(kjt_of(keys, ids, None, torch.int64, torch.int64))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_negative_ids_of_unsplit_features_pass_through():
    model = [TableFingerprint("a", 4, 2, ("a",)), TableFingerprint("b", 4, 2, ("b",))]
    splits = [Split("a", "hot_cold", ("ah", "ac"), hot_ids=(2,))]
    keys = ["b", "a"]
    ids = {"a": [[2, 1], [3]], "b": [[-5, 9], []]}
    inp = kjt_of(keys, ids, None, torch.int64, torch.int64)
    out = BatchTransform(model, splits, "test")(inp)
    assert_matches_reference(out, inp, reference(model, splits, keys, ids, None))


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_the_loader_yields_every_batch_in_order_and_fails_at_the_bad_one(ahead):
    rng = random.Random(7)
    model, splits = random_case(rng)
    while not splits:
        model, splits = random_case(rng)
    transform = BatchTransform(model, splits, "test")
    drawn = [random_batch(rng, model, 4, weighted=False) for _ in range(6)]
    bad_at = 4  # this batch has an id beyond its split table
    split = next(t for t in model if t.name == splits[0].table)
    drawn[bad_at][1][split.feature_names[0]][0].append(split.num_embeddings)
    inputs = [kjt_of(k, i, None, torch.int64, torch.int64) for k, i, _ in drawn]
    out = transform.loader(inputs, ahead)
    for n in range(bad_at):  # ahead: the bad batch is already transformed, not yet raised
        keys, ids, _ = drawn[n]
        assert_matches_reference(next(out), inputs[n], reference(model, splits, keys, ids, None))
    with pytest.raises(PlanError, match=f"split table {split.name!r}"):
        next(out)


@pytest.mark.parametrize("bad", [-1, 30, 10**6])
def test_hot_cold_ids_outside_the_table_are_refused_by_the_gather(bad):
    """A hot/cold table routed by lookup table (its gather checks the ids) refuses an id just
    outside its rows, naming the feature, where the next table's rows would be in range."""
    model = [
        TableFingerprint("a", 30, 4, ("x", "y")),
        TableFingerprint("b", 50, 4, ("z",)),
    ]
    splits = [
        Split(t.name, "hot_cold", part_names(t.name, "hot_cold"), hot_ids=(3, 1)) for t in model
    ]
    transform = BatchTransform(model, splits, "test")
    ids = {"x": [[0, 5], [29]], "y": [[2], [1, bad]], "z": [[49], []]}
    keys = ["x", "y", "z"]
    with pytest.raises(PlanError, match=rf"feature 'y' of split table 'a' has ids {bad}\.\.{bad}"):
        transform(kjt_of(keys, ids, None, torch.int64, torch.int64))
    ids["y"][1][1] = 7
    out = transform(kjt_of(keys, ids, None, torch.int64, torch.int64))
    hot, cold = out[virtual_feature("y", "a__hot")], out[virtual_feature("y", "a__cold")]
    assert hot.values().tolist() == [1] and hot.lengths().tolist() == [0, 1]  # 1: hot row 1
    assert cold.values().tolist() == [2, 7] and cold.lengths().tolist() == [1, 1]
