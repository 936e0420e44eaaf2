"""Hot ids (hot_ids.parquet): counting, coverage and cap against exact recounts; the reader's
refusals; and a 2-rank `sparselift profile` whose file matches the ids its ranks looked up."""

from __future__ import annotations

import json
from collections import Counter
from itertools import accumulate
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sparselift.errors import UserError
from sparselift.profiler.access import TableMeta
from sparselift.profiler.access_stats import table_histograms, table_step_from_tensors
from sparselift.profiler.hot_ids import (
    HOT_IDS,
    HotIds,
    check_table_size,
    ids_to_cover,
    read_hot_ids,
    record_hot_ids,
    select_hot,
)
from sparselift.profiler.manifest import ProfileFacts, build_manifest, table_entries
from sparselift.workloads.batches import scatter_ids, zipf_ranks

# (table, rows, zipf alpha, lookups per rank and step): uniform (many ties), mild, steep
TABLES = [("u", 3000, 0.0, 700), ("m", 50_000, 0.8, 1500), ("s", 20_000, 1.3, 900)]
RANKS, STEPS = 2, 3


def _ids(rows: int, alpha: float, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scatter_ids(zipf_ranks(n, rows, alpha, g), rows, 7)


@pytest.fixture(scope="module")
def window():
    """TableSteps of every table, rank and step, and every id each table looked up."""
    steps, looked_up = [], {t: [] for t, *_ in TABLES}
    for r in range(RANKS):
        for s in range(STEPS):
            for i, (name, rows, alpha, n) in enumerate(TABLES):
                ids = _ids(rows, alpha, n, seed=1000 * r + 10 * s + i)
                looked_up[name] += ids.tolist()
                lengths = torch.ones(n, dtype=torch.int64)
                steps.append(table_step_from_tensors(name, r, s, n, ids.to(torch.int32), lengths))
    return steps, looked_up


def _exact(ids: list[int], coverage: float, cap: int) -> tuple[list[int], list[int], bool]:
    """The hot set by hand: ids by count desc then id asc, until `coverage` of lookups, ≤ cap."""
    ranked = sorted(Counter(ids).items(), key=lambda kv: (-kv[1], kv[0]))
    kept, covered = [], 0
    for i, c in ranked:
        if covered * 10**6 >= round(coverage * 10**6) * len(ids):
            break
        kept.append((i, c))
        covered += c
    capped = len(kept) > cap
    kept = kept[:cap]
    return [i for i, _ in kept], [c for _, c in kept], capped


def test_merged_histograms_match_a_counter(window):
    steps, looked_up = window
    hists = table_histograms(steps)
    assert sorted(hists) == sorted(looked_up)
    for name, ids in looked_up.items():
        exact = Counter(ids)
        h = hists[name]
        assert dict(zip(h.ids.tolist(), h.counts.tolist(), strict=True)) == exact
        assert h.ids.dtype == torch.int64  # the KJT's int32 ids widened


@pytest.mark.parametrize("cap", [10**6, 400, 25])
def test_hot_set_matches_an_exact_recount(window, cap):
    """Large cap: the coverage decides; 400: the partition path (distinct ids > cap) on tables
    whose 90 % needs fewer or more; 25: the cap decides everywhere."""
    steps, looked_up = window
    hists = table_histograms(steps)
    seen_capped = set()
    for name, rows, _, _ in TABLES:
        h = hists[name]
        hot = select_hot(name, h.ids.numpy(), h.counts.numpy(), rows, cap=cap)
        ids, counts, capped = _exact(looked_up[name], 0.9, cap)
        assert hot.ids.tolist() == ids and hot.counts.tolist() == counts, name
        assert hot.capped == capped and hot.lookups == len(looked_up[name])
        assert hot.distinct_ids == len(set(looked_up[name])) and hot.num_embeddings == rows
        assert hot.ids.dtype == np.int64 and hot.counts.dtype == np.int64
        seen_capped.add(capped)
        if not capped:
            assert hot.covered_share(len(ids)) >= 0.9 > hot.covered_share(len(ids) - 1)
    assert seen_capped == ({False} if cap == 10**6 else {True} if cap == 25 else {True, False})


@pytest.mark.parametrize("share", [0.0, 0.25, 0.5, 0.75, 0.9, 0.95])
def test_ids_covering_matches_a_recount(window, share):
    """The fewest hottest ids covering `share`; None beyond what was kept (0.95 > 0.9)."""
    steps, looked_up = window
    hists = table_histograms(steps)
    for name, rows, _, _ in TABLES:
        h = hists[name]
        hot = select_hot(name, h.ids.numpy(), h.counts.numpy(), rows)
        ranked = sorted(Counter(looked_up[name]).values(), reverse=True)
        target = round(share * 100) * len(looked_up[name])  # exact: 100 · share · lookups
        prefixes = [0, *accumulate(ranked)][:-1]
        need = sum(1 for p in prefixes if p * 100 < target)
        want = need if need <= hot.ids.size else None
        assert hot.ids_covering(share) == want, (name, share)


def test_ids_to_cover_counts_exactly():
    counts = np.array([3, 3, 2, 1, 1])
    assert [ids_to_cover(counts, 10, s) for s in (0.6, 0.7, 0.8, 0.9, 1.0)] == [2, 3, 3, 4, 5]
    # 0.07 * 100 is 7.000000000000001 in floating point: 7 lookups still suffice
    assert ids_to_cover(np.array([7] + [1] * 93), 100, 0.07) == 1
    assert ids_to_cover(counts, 12, 1.0) is None  # two lookups were never kept
    assert ids_to_cover(np.array([], dtype=np.int64), 0, 0.5) is None


def test_capped_set_answers_only_what_it_covers():
    uniform = np.arange(1000, dtype=np.int64)
    hot = select_hot("t", uniform[::-1].copy(), np.full(1000, 2), 1000, cap=100)
    assert hot.capped and hot.ids.tolist() == list(range(100))  # ties: smallest ids first
    assert hot.ids_covering(0.1) == 100 and hot.ids_covering(0.1001) is None
    assert hot.covered_share(50) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        hot.ids_covering(1.5)


def test_table_without_lookups_keeps_nothing():
    e = np.empty(0, dtype=np.int64)
    hot = select_hot("t", e, e, 10)
    assert hot.ids.size == 0 and hot.lookups == 0 and not hot.capped
    assert hot.ids_covering(0.0) == 0 and hot.ids_covering(0.5) is None
    assert hot.covered_share(3) == 0.0


# ------------------------------------------------------------------ the file and its reader


def _profile(tmp_path: Path, window) -> Path:
    """A profile directory holding hot_ids.parquet and the manifest that describes it."""
    steps, _ = window
    d = tmp_path / "prof"
    d.mkdir()
    metas = [TableMeta(n, rows, 16, (n,), "SUM", "ebc") for n, rows, _, _ in TABLES]
    metas.append(TableMeta("idle", 100, 16, ("idle",), "SUM", "ebc"))  # never looked up
    summaries = record_hot_ids(d, metas, table_histograms(steps))
    facts = ProfileFacts(
        world_size=RANKS,
        local_world_size=RANKS,
        device="cpu",
        backend="gloo",
        batch_size=1,
        warmup=0,
        profiled_steps=list(range(STEPS)),
        tables=table_entries(metas, hot=summaries),
        sharding=[],
        pipeline=None,
        step_times_s=[],
        peak_memory_bytes=[],
        traces=[],
        execution_traces=[],
        hot_ids=HOT_IDS,
    )
    (d / "manifest.json").write_text(json.dumps(build_manifest(facts)))
    return d


def test_written_file_reads_back(tmp_path, window):
    steps, looked_up = window
    d = _profile(tmp_path, window)
    tbl = pq.read_table(d / HOT_IDS)
    assert tbl.column_names == ["table", "id", "count"]
    assert [str(tbl.schema.field(c).type) for c in ("table", "id", "count")] == [
        "string",
        "int64",
        "int64",
    ]
    names = tbl.column("table").to_pylist()
    assert names == sorted(names)
    hots = read_hot_ids(d)
    assert list(hots) == ["u", "m", "s", "idle"]  # manifest order
    hists = table_histograms(steps)
    for name, rows, _, _ in TABLES:
        want = select_hot(name, hists[name].ids.numpy(), hists[name].counts.numpy(), rows)
        got = hots[name]
        assert got.ids.tolist() == want.ids.tolist() and got.counts.tolist() == want.counts.tolist()
        assert (got.lookups, got.distinct_ids, got.num_embeddings, got.capped) == (
            len(looked_up[name]),
            len(set(looked_up[name])),
            rows,
            False,
        )
    assert hots["idle"].ids.size == 0 and hots["idle"].lookups == 0


def _rewrite(d: Path, edit) -> None:
    df = pq.read_table(d / HOT_IDS).to_pandas()
    pq.write_table(pa.Table.from_pandas(edit(df), preserve_index=False), d / HOT_IDS)


def _manifest(d: Path, edit) -> None:
    m = json.loads((d / "manifest.json").read_text())
    edit(m)
    (d / "manifest.json").write_text(json.dumps(m))


def _table(m, name):
    return next(t for t in m["tables"] if t["name"] == name)


def _swap_first_rows(df):
    i = df.index[df["table"] == "s"][:2]
    df.loc[i, ["id", "count"]] = df.loc[i[::-1], ["id", "count"]].to_numpy()
    return df


BREAKERS = {
    "old profile": (lambda d: _manifest(d, lambda m: m["files"].pop("hot_ids")), "not recorded"),
    "missing": (lambda d: (d / HOT_IDS).unlink(), "missing"),
    "garbage": (lambda d: (d / HOT_IDS).write_bytes(b"PAR1 not parquet"), "unreadable Parquet"),
    "no count": (lambda d: _rewrite(d, lambda df: df.drop(columns="count")), "count"),
    "float ids": (lambda d: _rewrite(d, lambda df: df.astype({"id": float})), "'id'"),
    "id too big": (
        lambda d: _rewrite(d, lambda df: df.assign(id=df["id"].where(df["table"] != "m", 50_000))),
        "'m': id 50000 outside",
    ),
    "count 0": (
        lambda d: _rewrite(d, lambda df: df.assign(count=df["count"].where(df["table"] != "u", 0))),
        "'u': count 0",
    ),
    "repeated id": (
        lambda d: _rewrite(d, lambda df: df.assign(id=df["id"].where(df["table"] != "s", 5))),
        "'s': an id appears more than once",
    ),
    "out of order": (lambda d: _rewrite(d, _swap_first_rows), "'s': rows not by count"),
    "tables unsorted": (
        lambda d: _rewrite(d, lambda df: df.iloc[::-1].reset_index(drop=True)),
        "not sorted by table",
    ),
    "other run's table": (
        lambda d: _rewrite(d, lambda df: df.assign(table=df["table"].replace("u", "zz"))),
        "'zz' is not among",
    ),
    "rows dropped": (
        lambda d: _rewrite(d, lambda df: df.drop(df.index[df["table"] == "m"][-3:])),
        ("'m': ", "the manifest's summary says"),
    ),
    "bad summary": (
        lambda d: _manifest(d, lambda m: _table(m, "s")["hot_ids"].update(lookups="many")),
        "'s': lookups 'many'",
    ),
    "summary lacks keys": (
        lambda d: _manifest(d, lambda m: _table(m, "u")["hot_ids"].pop("capped")),
        "'u': hot_ids lacks capped",
    ),
}


@pytest.mark.parametrize("case", list(BREAKERS))
def test_malformed_files_are_refused_in_one_line(tmp_path, window, case):
    d = _profile(tmp_path, window)
    breaker, want = BREAKERS[case]
    breaker(d)
    with pytest.raises(UserError) as e:
        read_hot_ids(d)
    msg = str(e.value)
    wants = (want,) if isinstance(want, str) else want
    assert len(msg.splitlines()) == 1 and all(w in msg for w in wants), msg
    assert str(d) in msg and ("manifest.json" in msg or HOT_IDS in msg), msg


def test_stale_table_size_is_refused_naming_the_table():
    hot = HotIds("cat_3", np.array([4]), np.array([9]), 9, 1, 200_000, False)
    check_table_size(hot, "cat_3", 200_000)  # same size: accepted
    with pytest.raises(UserError) as e:
        check_table_size(hot, "cat_3", 40_000_000)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "'cat_3'" in msg and "200,000" in msg
    assert "40,000,000" in msg and "stale" in msg


# ------------------------------------------------------------------ a real 2-rank profile


@pytest.mark.slow
def test_profiled_hot_ids_match_the_ids_the_ranks_looked_up(tmp_path):
    """Under the base pipeline step k forwards the rank's k-th batch of its seeded stream, so the
    window's ids are those batches regenerated here; every id of the window is recounted."""
    from sparselift.cli import main
    from sparselift.workloads.batches import SyntheticBatches
    from sparselift.workloads.spec import load_workload

    warmup, n_steps, max_rows = 2, 3, 3000
    out = tmp_path / "p"
    argv = ["profile", "--workload", "tiny", "--nproc", "2", "--max-rows", str(max_rows)]
    argv += ["--steps", str(n_steps), "--warmup", str(warmup), "--after", "0"]
    assert main([*argv, "--steady-steps", "0", "--out", str(out)]) == 0
    spec = load_workload("tiny")
    looked_up: dict[str, list[int]] = {t.name: [] for t in spec.tables}
    for rank in range(2):
        gen = SyntheticBatches(spec, rank=rank, seed=0, max_rows=max_rows)
        batches = [gen.next_batch().sparse_features for _ in range(warmup + n_steps)]
        for kjt in batches[warmup:]:
            d = kjt.to_dict()
            for t in spec.tables:
                for f in t.features:
                    looked_up[t.name] += d[f].values().tolist()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["hot_ids"] == HOT_IDS and manifest["errors"] == []
    hots = read_hot_ids(out)
    assert sorted(hots) == sorted(looked_up)
    capped = spec.capped(max_rows)
    for t in capped.tables:
        ids, counts, was_capped = _exact(looked_up[t.name], 0.9, 65_536)
        hot = hots[t.name]
        assert hot.ids.tolist() == ids and hot.counts.tolist() == counts, t.name
        assert (hot.lookups, hot.distinct_ids, hot.capped) == (
            len(looked_up[t.name]),
            len(set(looked_up[t.name])),
            was_capped,
        )
        assert hot.num_embeddings == t.num_embeddings
        check_table_size(hot, t.name, t.num_embeddings)


@pytest.mark.slow
def test_unwritable_hot_ids_leave_training_and_the_rest_of_the_profile(tmp_path, capsys):
    """A directory where hot_ids.parquet should go: the profile is written without it, says so,
    and the reader refuses it in one line."""
    from sparselift.cli import main

    out = tmp_path / "p"
    (out / HOT_IDS).mkdir(parents=True)
    argv = ["profile", "--workload", "tiny", "--nproc", "2", "--steps", "1", "--warmup", "1"]
    rc = main([*argv, "--after", "0", "--steady-steps", "0", "--force", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1 and "incomplete" in err and "hot ids" in err
    m = json.loads((out / "manifest.json").read_text())
    assert m["files"]["hot_ids"] is None and all(t["hot_ids"] is None for t in m["tables"])
    assert any("hot ids" in e and "rank 0" in e for e in m["errors"])
    assert (out / "access_stats.parquet").is_file() and len(m["step_times_s"][0]) == 2
    with pytest.raises(UserError, match="not recorded"):
        read_hot_ids(out)
