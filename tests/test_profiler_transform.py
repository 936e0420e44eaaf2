"""The split plans' batch transform and the split model's recombination timed by the profiler,
fitted by the analysis, read by the optimizer as measured coefficients."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from sparselift.analysis.recombine_fit import RecombineSample, fit_recombine, recombine_samples_of
from sparselift.analysis.transform_fit import TransformSample, fit_transform, samples_of
from sparselift.calibration import Calibration
from sparselift.cli import main
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.topology import preset
from sparselift.plans.errors import PlanError
from sparselift.profiler import recombine_cost
from sparselift.profiler.access import Capture, TableMeta
from sparselift.profiler.access_stats import table_step
from sparselift.profiler.recombine_cost import layout_of, recombine_record, time_recombine
from sparselift.profiler.transform_cost import time_transform, transform_record

FIX = Path(__file__).parent / "fixtures"
STEPS, WARMUP = 3, 2


# ---------------------------------------------------------------------------------- the fit


def test_the_fit_recovers_a_known_linear_cost():
    rng = np.random.default_rng(0)
    a, b = 50e-6, 20e-9
    samples = []
    for _ in range(40):
        f = int(rng.integers(1, 17))
        ids = int(rng.integers(100, 200_000))
        noise = rng.normal(0, 2e-6)
        samples.append(TransformSample(f, ids, a * f + b * ids + noise))
    fit = fit_transform(samples)
    assert fit is not None and fit.x == "ids" and fit.n == 40
    assert fit.a_s == pytest.approx(a, rel=0.05)
    assert fit.b_s == pytest.approx(b, rel=0.02)
    assert fit.r2 > 0.99


def test_the_fit_clips_a_negative_coefficient_to_zero():
    # time falls with ids at a fixed count of features: per id it costs nothing, per feature all
    samples = [TransformSample(1, 1000, 110e-6), TransformSample(1, 9000, 90e-6)]
    samples += [TransformSample(4, 4000, 400e-6)]
    fit = fit_transform(samples)
    assert fit is not None and fit.b_s == 0.0
    assert fit.a_s == pytest.approx((110 + 90 + 4 * 400) * 1e-6 / 18)
    # no sample routes a feature: nothing to fit
    assert fit_transform([TransformSample(0, 0, 1e-6)]) is None
    assert fit_transform([]) is None


def test_a_manifest_without_the_record_has_no_samples_and_a_malformed_one_is_named():
    assert samples_of({}, "m.json") == []
    assert samples_of({"batch_transform": None}, "m.json") == []
    ok = {"samples": [{"features": 2, "ids": 10, "seconds": 1e-5}]}
    assert samples_of({"batch_transform": ok}, "m.json") == [TransformSample(2, 10, 1e-5)]
    bad = {"samples": [ok["samples"][0], {"features": 1, "ids": -3, "seconds": 1e-5}]}
    with pytest.raises(UserError, match=r"m\.json: batch_transform\.samples\[1\] needs"):
        samples_of({"batch_transform": bad}, "m.json")
    with pytest.raises(UserError, match=r"m\.json: batch_transform must be an object"):
        samples_of({"batch_transform": [1, 2]}, "m.json")


# ----------------------------------------------------------------- the timing, on one rank


def _tables(n: int, rows: int = 1000) -> list[TableMeta]:
    return [TableMeta(f"t{i}", rows, 8, (f"f{i}",), "SUM", "sparse.ebc") for i in range(n)]


def _kjt(tables: list[TableMeta], batch: int, pooling: list[int], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    keys = [f for t in tables for f in t.features]
    lengths = torch.tensor([p for p in pooling for _ in range(batch)], dtype=torch.int64)
    values = torch.randint(0, tables[0].num_embeddings, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, stride=batch)


def test_a_rank_times_each_table_alone_and_the_first_ones_together():
    tables = _tables(5)
    pooling = [1, 3, 2, 10, 4]
    kjt = _kjt(tables, 64, pooling)
    steps = [table_step(t, 0, 7, kjt) for t in tables]
    caps = [Capture(6, "_dmp_wrapped_module.sparse.ebc", _kjt(tables, 64, pooling, 1))]
    caps.append(Capture(7, "_dmp_wrapped_module.sparse.ebc", kjt))
    got = time_transform(tables, caps, steps, rank=0, repeats=3)
    assert got is not None and got.device == "cpu" and got.baseline_s > 0
    sets = [s["tables"] for s in got.samples]
    assert sets == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"], ["t0", "t1"], ["t0", "t1", "t2", "t3"]]
    for s in got.samples:  # the last step's batch: its ids, per table
        assert s["features"] == len(s["tables"])
        assert s["ids"] == sum(64 * pooling[int(t[1:])] for t in s["tables"])
        assert np.isfinite(s["seconds"])
    # at most max_tables, spread from the first table to the last
    few = time_transform(tables, caps, steps, rank=0, max_tables=3, repeats=1)
    assert few is not None
    assert [s["tables"] for s in few.samples] == [["t0"], ["t2"], ["t4"], ["t0", "t2"]]
    # a spent budget times no split at all, but still the baseline
    none = time_transform(tables, caps, steps, rank=0, repeats=1, budget_s=0.0)
    assert none is not None and none.samples == [] and none.baseline_s > 0
    assert time_transform(tables, [], steps, rank=0) is None


def test_weights_that_require_grad_are_timed_like_any_others():
    # a feature processor ahead of a collection (e.g. position weights) hands its input_dist
    # weights that require grad; the data path's transform never sees such weights
    tables = _tables(2)
    kjt = _kjt(tables, 16, [2, 3])
    weighted = KeyedJaggedTensor(
        keys=kjt.keys(),
        values=kjt.values(),
        lengths=kjt.lengths(),
        weights=torch.rand(kjt.values().numel(), requires_grad=True),
        stride=16,
    )
    steps = [table_step(t, 0, 0, weighted) for t in tables]
    got = time_transform(tables, [Capture(0, "sparse.ebc", weighted)], steps, rank=0, repeats=1)
    assert got is not None and [s["tables"] for s in got.samples] == [["t0"], ["t1"], ["t0", "t1"]]


def test_the_record_pools_the_ranks_samples_and_fits_them():
    tables = _tables(4)
    kjt = _kjt(tables, 32, [1, 2, 8, 3])
    steps = [table_step(t, 0, 0, kjt) for t in tables]
    r0 = time_transform(tables, [Capture(0, "sparse.ebc", kjt)], steps, rank=0, repeats=2)
    r1 = time_transform(tables, [Capture(0, "sparse.ebc", kjt)], steps, rank=1, repeats=2)
    rec = transform_record([r0, r1, None])
    assert rec is not None and rec["device"] == "cpu" and rec["repeats"] == 2
    assert [s["rank"] for s in rec["samples"]] == [0] * 6 + [1] * 6
    assert rec["baseline_s"] == [r0.baseline_s, r1.baseline_s, None]
    fit = fit_transform(samples_of({"batch_transform": rec}, "x"))
    assert fit is not None and (rec["a_s"], rec["b_s"]) == (fit.a_s, fit.b_s)
    assert transform_record([None, None]) is None
    json.dumps(rec)  # goes into the manifest as it is


def test_a_batch_the_transform_refuses_raises_for_the_session_to_record():
    tables = _tables(2)
    kjt = KeyedJaggedTensor(
        keys=["f0", "f1"],
        values=torch.tensor([1, 2, 3]),
        lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=[[2], [1]],
    )
    with pytest.raises(PlanError, match="variable batch size"):
        time_transform(tables, [Capture(0, "sparse.ebc", kjt)], [], rank=0)


# ------------------------------------------------------------------ the recombination


def test_the_recombination_fit_recovers_a_known_cost_per_element():
    rng = np.random.default_rng(1)
    b = 1.5e-9
    samples = []
    for _ in range(30):
        written = int(rng.integers(10_000, 2_000_000))
        read = int(rng.integers(0, 2 * written))
        samples.append(RecombineSample(read, written, b * (read + written) * rng.normal(1, 0.01)))
    fit = fit_recombine(samples)
    assert fit is not None and fit.x == "elements" and fit.n == 30 and fit.a_s == 0.0
    assert fit.b_s == pytest.approx(b, rel=0.01)
    assert fit.r2 > 0.99
    # through the origin: a cost per element, never below 0
    fit = fit_recombine([RecombineSample(0, 1000, 2e-6), RecombineSample(1000, 1000, 4e-6)])
    assert fit is not None and fit.b_s == pytest.approx((1000 * 2e-6 + 2000 * 4e-6) / 5e6)
    assert fit_recombine([RecombineSample(0, 1000, -1e-6)]).b_s == 0.0
    assert fit_recombine([RecombineSample(0, 0, 1e-6)]) is None and fit_recombine([]) is None


def test_a_manifest_without_the_recombination_has_no_samples_and_a_malformed_one_is_named():
    assert recombine_samples_of({}, "m.json") == []
    assert recombine_samples_of({"recombine": None}, "m.json") == []
    ok = {"samples": [{"split": 1, "read": 64, "written": 128, "seconds": 1e-5}]}
    assert recombine_samples_of({"recombine": ok}, "m.json") == [RecombineSample(64, 128, 1e-5)]
    bad = {"samples": [ok["samples"][0], {"read": 1, "written": "x", "seconds": 1e-5}]}
    with pytest.raises(UserError, match=r"m\.json: recombine\.samples\[1\] needs"):
        recombine_samples_of({"recombine": bad}, "m.json")
    with pytest.raises(UserError, match=r"m\.json: recombine must be an object"):
        recombine_samples_of({"recombine": "fast"}, "m.json")


def _ebc_tables(n: int) -> list[TableMeta]:
    dims = [8, 16, 4, 8, 12, 8]
    return [
        TableMeta(
            f"t{i}", 100, dims[i % 6], tuple(f"f{i}_{j}" for j in range(1 + i % 2)), "SUM", "e"
        )
        for i in range(n)
    ]


def test_the_timed_layout_is_the_one_the_split_model_builds():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from sparselift.plans.rewrite import VirtualTables
    from sparselift.plans.splits import part_names
    from sparselift.plans.types import Split

    tables = _ebc_tables(5)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=t.name,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                feature_names=list(t.features),
            )
            for t in tables
        ],
        device=torch.device("meta"),
    )
    for k in (0, 1, 3, 5):
        splits = {
            t.name: Split(t.name, "hot_cold", part_names(t.name, "hot_cold"), hot_ids=(0, 1))
            for t in tables[:k]
        }
        vt = VirtualTables(ebc, splits, "test")
        keys, lengths, layout = layout_of(tables, k)
        inner = vt.virtual.embedding_bag_configs()
        assert keys == [f for c in inner for f in c.feature_names]
        assert lengths == [c.embedding_dim for c in inner for _ in c.feature_names]
        assert layout == vt._layout


def test_a_rank_times_the_recombination_at_its_batch_and_the_models_widths():
    tables = _ebc_tables(5) + [TableMeta("seq", 50, 8, ("s",), "NONE", "e")]
    kjt = _kjt(_tables(2), 48, [1, 2])  # only its batch matters
    got = time_recombine(tables, [Capture(0, "e", kjt)], torch.device("cpu"), 0, repeats=2)
    assert got is not None and got.device == "cpu" and got.rows == 48
    widths = [t.embedding_dim * len(t.features) for t in tables[:5]]  # the sequence table: none
    assert [s["split"] for s in got.samples] == [0, 1, 2, 4, 5]
    for s in got.samples:
        assert s["written"] == 48 * sum(widths)
        assert s["read"] == 48 * 2 * sum(widths[: s["split"]])
        assert 0 < s["seconds"] < 1.0
    assert 0 < got.elapsed_s < 5.0
    # a spent budget still times the baseline
    few = time_recombine(tables, [Capture(0, "e", kjt)], torch.device("cpu"), 0, budget_s=0.0)
    assert few is not None and [s["split"] for s in few.samples] == [0]
    assert time_recombine(tables, [], torch.device("cpu"), 0) is None
    assert time_recombine(tables[5:], [Capture(0, "e", kjt)], torch.device("cpu"), 0) is None


def test_a_batch_too_large_for_the_memory_cap_is_timed_on_fewer_rows(monkeypatch):
    tables = _ebc_tables(4)
    kjt = _kjt(_tables(1), 1000, [1])
    width = sum(t.embedding_dim * len(t.features) for t in tables)
    monkeypatch.setattr(recombine_cost, "BYTES_MAX", 4 * (2 * 2 * width + 3 * width) * 100)
    got = time_recombine(tables, [Capture(0, "e", kjt)], torch.device("cpu"), 0, repeats=1)
    assert got is not None and got.rows == 100
    assert all(s["written"] == 100 * width for s in got.samples)


def test_the_recombination_record_pools_the_ranks_samples_and_fits_them():
    tables = _ebc_tables(3)
    kjt = _kjt(_tables(1), 32, [1])
    r0 = time_recombine(tables, [Capture(0, "e", kjt)], torch.device("cpu"), 0, repeats=2)
    r2 = time_recombine(tables, [Capture(0, "e", kjt)], torch.device("cpu"), 2, repeats=2)
    rec = recombine_record([r0, None, r2])
    assert rec is not None and rec["device"] == "cpu" and rec["repeats"] == 2
    assert [s["rank"] for s in rec["samples"]] == [0] * 4 + [2] * 4
    assert rec["rows"] == [32, None, 32]
    fit = fit_recombine(recombine_samples_of({"recombine": rec}, "x"))
    assert fit is not None and rec["b_s"] == fit.b_s and fit.b_s > 0
    assert recombine_record([None]) is None
    json.dumps(rec)  # goes into the manifest as it is


# ------------------------------------------------------------ end to end: profile, analyze


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tx") / "tiny"
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
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    return out


@pytest.mark.slow
def test_a_profile_records_every_ranks_timings_on_its_last_batch(profile_dir):
    m = json.loads((profile_dir / "manifest.json").read_text())
    assert m["errors"] == []
    rec = m["batch_transform"]
    assert rec["device"] == "cpu" and len(rec["baseline_s"]) == 2
    assert all(b > 0 for b in rec["baseline_s"]) and all(e < 5.0 for e in rec["elapsed_s"])
    n_tables = len(m["tables"])
    for rank in (0, 1):
        mine = [s for s in rec["samples"] if s["rank"] == rank]
        singles = [s for s in mine if len(s["tables"]) == 1]
        assert len(singles) == min(n_tables, 16)
        # each table alone routes the ids its features had in the rank's last profiled step
        access = pd.read_parquet(profile_dir / "access_stats.parquet")
        last = access[(access["rank"] == rank) & (access["step"] == access["step"].max())]
        ids = dict(zip(last["table"], last["ids"], strict=True))
        for s in singles:
            assert s["ids"] == ids[s["tables"][0]]
    assert rec["a_s"] >= 0 and rec["b_s"] >= 0 and rec["a_s"] + rec["b_s"] > 0


@pytest.mark.slow
def test_analyze_writes_the_fit_and_the_optimizer_prices_with_it(profile_dir, tmp_path):
    assert main(["analyze", str(profile_dir), "--out", str(tmp_path / "an")]) == 0
    doc = json.loads((tmp_path / "an" / "calibration.json").read_text())
    op = doc["ops"]["batch_transform"]
    rec = json.loads((profile_dir / "manifest.json").read_text())["batch_transform"]
    assert op["x"] == "ids" and op["n"] == len(rec["samples"])
    assert (op["a_s"], op["b_s"]) == pytest.approx((rec["a_s"], rec["b_s"]))
    topo = preset("cpu-gloo", 2, 2)
    c = coefficients(topo, Calibration.from_dict(doc))
    assert (c.batch_transform.a_s, c.batch_transform.b_s) == pytest.approx((op["a_s"], op["b_s"]))
    # timed stand-alone only (no split plan's steps): the fit's values, assumed for the steps
    assert not c.measured("batch_transform")
    assert c.evidence_dict()["batch_transform"]["from"].startswith("timed stand-alone in")
    # a profile that never timed the transform has no such op: the preset's, assumed
    fixture = FIX / "profile_tiny_table_wise"
    assert main(["analyze", str(fixture), "--out", str(tmp_path / "old"), "--no-cache"]) == 0
    old_doc = json.loads((tmp_path / "old" / "calibration.json").read_text())
    assert "batch_transform" not in old_doc["ops"]
    assert not coefficients(topo, Calibration.from_dict(old_doc)).measured("batch_transform")


@pytest.mark.slow
def test_several_profiles_are_fitted_on_all_their_timings_together(profile_dir, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(profile_dir, other)
    m = json.loads((other / "manifest.json").read_text())
    # the other profile's transform twice as slow per feature and per id
    for s in m["batch_transform"]["samples"]:
        s["seconds"] = 2 * max(s["seconds"], 1e-6)
    for s in m["recombine"]["samples"]:
        s["seconds"] *= 2
    (other / "manifest.json").write_text(json.dumps(m))
    out = tmp_path / "joint"
    assert main(["analyze", str(profile_dir), str(other), "--out", str(out), "--no-cache"]) == 0
    op = json.loads((out / "calibration.json").read_text())["ops"]["batch_transform"]
    both = samples_of(json.loads((profile_dir / "manifest.json").read_text()), "a")
    both += samples_of(m, "b")
    fit = fit_transform(both)
    assert fit is not None and op["n"] == len(both)
    assert (op["a_s"], op["b_s"]) == pytest.approx((fit.a_s, fit.b_s))
    rc = json.loads((out / "calibration.json").read_text())["ops"]["recombine"]
    pooled = recombine_samples_of(json.loads((profile_dir / "manifest.json").read_text()), "a")
    pooled += recombine_samples_of(m, "b")
    assert rc["n"] == len(pooled) and rc["b_s"] == pytest.approx(fit_recombine(pooled).b_s)


@pytest.mark.slow
def test_a_profile_records_every_ranks_recombination_at_the_models_widths(profile_dir):
    m = json.loads((profile_dir / "manifest.json").read_text())
    rec = m["recombine"]
    assert rec["device"] == "cpu" and rec["rows"] == [m["batch_size"]] * 2
    assert all(0 < e < 2.0 for e in rec["elapsed_s"])
    widths = [t["embedding_dim"] * len(t["feature_names"]) for t in m["tables"]]
    for rank in (0, 1):
        mine = [s for s in rec["samples"] if s["rank"] == rank]
        assert mine[0]["split"] == 0 and mine[0]["read"] == 0
        for s in mine:
            assert s["written"] == m["batch_size"] * sum(widths)
            assert s["read"] == m["batch_size"] * 2 * sum(widths[: s["split"]])
            assert s["seconds"] > 0
    assert rec["b_s"] > 0


@pytest.mark.slow
def test_analyze_writes_the_recombination_and_the_optimizer_prices_with_it(profile_dir, tmp_path):
    assert main(["analyze", str(profile_dir), "--out", str(tmp_path / "an")]) == 0
    doc = json.loads((tmp_path / "an" / "calibration.json").read_text())
    op = doc["ops"]["recombine"]
    rec = json.loads((profile_dir / "manifest.json").read_text())["recombine"]
    assert op["x"] == "elements" and op["n"] == len(rec["samples"]) and op["a_s"] == 0.0
    assert op["b_s"] == pytest.approx(rec["b_s"]) and op["b_s"] > 0
    topo = preset("cpu-gloo", 2, 2)
    c = coefficients(topo, Calibration.from_dict(doc))
    assert c.recombine_b_s == pytest.approx(op["b_s"])
    assert c.evidence_dict()["recombine_b_s"]["from"].startswith("timed stand-alone in")
    fixture = FIX / "profile_tiny_table_wise"  # never timed it: the preset's, assumed
    assert main(["analyze", str(fixture), "--out", str(tmp_path / "old"), "--no-cache"]) == 0
    old_doc = json.loads((tmp_path / "old" / "calibration.json").read_text())
    assert "recombine" not in old_doc["ops"]
    assert not coefficients(topo, Calibration.from_dict(old_doc)).measured("recombine_b_s")
