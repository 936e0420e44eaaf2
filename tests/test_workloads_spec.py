"""Workload specs: built-ins load, every bad input gets one line and exit code 2."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sparselift.errors import UserError
from sparselift.workloads import builtin_names, load_workload
from sparselift.workloads.spec import parse_workload


def test_builtin_workloads_load():
    assert {"tiny", "criteo-kaggle", "multihot-26"} <= set(builtin_names())
    tiny = load_workload("tiny")
    assert len(tiny.tables) == 8 and tiny.batch_size == 256
    assert tiny.tables[2].pooling == "poisson" and tiny.tables[2].pooling_factor == 4
    kaggle = load_workload("criteo-kaggle")
    assert sum(t.num_embeddings for t in kaggle.tables) == 33_762_577
    assert sum(t.pooling_factor for t in load_workload("multihot-26").tables) == 214


BENCH_WORKLOADS = Path(__file__).resolve().parent.parent / "benchmarks" / "workloads"


@pytest.mark.parametrize("path", sorted(BENCH_WORKLOADS.glob("*.json")), ids=lambda p: p.stem)
def test_benchmark_workloads_load(path):
    assert load_workload(str(path)).name == path.stem


def test_the_demos_heavy_tables_are_put_on_one_rank_by_torchrecs_default_plan(tmp_path):
    """`make demo`'s premise (README): two tables take 98 % of the lookups, and TorchRec's planner,
    called without statistics, places both on one rank."""
    from sparselift.cli import main
    from sparselift.plans import load

    path = BENCH_WORKLOADS / "two-heavy-tables.json"
    spec = load_workload(str(path))
    lookups = {t.name: t.pooling_factor for t in spec.tables}
    assert lookups["clicks"] + lookups["views"] >= 0.98 * sum(lookups.values())
    out = tmp_path / "torchrec.plan.json"
    argv = ["plan", "from-torchrec", "--workload", str(path), "--world-size", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    ranks = {t.name: t.ranks for t in load(out).tables}
    assert ranks["clicks"] == ranks["views"] and len(ranks["clicks"]) == 1


def test_load_by_path_roundtrips(write_json):
    spec = load_workload("tiny")
    again = load_workload(write_json(spec.to_dict()))
    assert again.tables == spec.tables and again.model == spec.model


def test_capped_hashes_rows_down():
    spec = load_workload("criteo-kaggle").capped(1_000_000)
    assert max(t.num_embeddings for t in spec.tables) == 1_000_000
    assert min(t.num_embeddings for t in spec.tables) == 3


def _tiny_dict():
    return load_workload("tiny").to_dict()


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (
            lambda d: d["tables"][3].update(num_embeddings=0),
            "table 't3': num_embeddings must be an integer in 1..",
        ),
        (
            lambda d: d["tables"][1].update(embedding_dim=-4),
            "table 't1': embedding_dim must be an integer in 1..",
        ),
        (lambda d: d["tables"][0].update(embedding_dim=16), "tables t0 differ"),
        (lambda d: d["tables"][0].update(pooling="gauss"), "pooling 'gauss' is not one of"),
        (lambda d: d["tables"].clear(), "no tables"),
        (
            lambda d: d["tables"].append(copy.deepcopy(d["tables"][0])),
            "table name 't0' appears twice",
        ),
        (lambda d: d["tables"][1].update(name="items"), "'items' cannot name a table"),
        (
            lambda d: d["tables"][1].update(feature_names=[]),
            "table 't1': feature_names must be a non-empty list",
        ),
        (lambda d: d["tables"][1].update(name="a.b"), "table 'a.b': a table name cannot hold '.'"),
        (lambda d: d.pop("batch_size"), "missing key 'batch_size'"),
        (lambda d: d["model"].update(arch="transformer"), "model.arch 'transformer'"),
        (
            lambda d: d["tables"][0].update(num_embeddings="many"),
            "'num_embeddings' must be an integer",
        ),
        (
            lambda d: d["tables"][2].update(num_embeddings=10**20),
            "table 't2': num_embeddings must be an integer in 1..1,099,511,627,776 (2^40), "
            "got 100,000,000,000,000,000,000",
        ),
        (
            lambda d: d["tables"][2].update(num_embeddings=1e5),
            "'num_embeddings' must be an integer",
        ),
        (lambda d: d["tables"][2].update(embedding_dim=True), "'embedding_dim' must be an integer"),
        (lambda d: d["tables"][2].update(embedding_dim=6), "embedding_dim must be a multiple of 4"),
        (lambda d: d["tables"][2].update(embedding_dim=2**17), "embedding_dim must be an integer"),
        (lambda d: d["tables"][2].update(pooling_factor=float("nan")), "pooling_factor must be"),
        (lambda d: d["tables"][2].update(zipf_alpha=float("inf")), "zipf_alpha must be a number"),
        (
            lambda d: d["tables"][2].update(pooling_factor=10**400),
            "pooling_factor must be a number",
        ),
        (lambda d: d["tables"][2].update(zipf_alpha="1"), "'zipf_alpha' must be a number"),
        (lambda d: d.update(batch_size=2**30), "batch_size must be an integer in 1..16,777,216"),
        (lambda d: d.update(batch_size=256.0), "'batch_size' must be an integer"),
        (lambda d: d.update(name=""), "'name' must be a non-empty string"),
        (lambda d: d.update(description=3), "'description' must be a string"),
        (lambda d: d["model"].update(dcn_num_layers=0), "dcn_num_layers must be an integer in"),
        (lambda d: d["model"].update(dense_arch=[64, 2**20]), "model.dense_arch must be"),
        (lambda d: d["model"].update(over_arch=[1]), "over_arch of dlrm needs at least 2 layers"),
        (
            lambda d: d["tables"][2].update(sequence=True),
            "table 't2' is a sequence table, which dlrm cannot take (it pools every feature): "
            "use arch concat-mlp",
        ),
        (lambda d: d["tables"][2].update(sequence="yes"), "'sequence' must be true or false"),
    ],
)
def test_bad_specs_are_refused_with_the_table_named(mutate, needle):
    d = _tiny_dict()
    mutate(d)
    with pytest.raises(UserError, match=None) as e:
        parse_workload(d, "spec.json")
    assert needle in str(e.value) and str(e.value).startswith("spec.json")


@pytest.mark.parametrize("name", ["items", "keys", "training", "a.b", "item_table", "users"])
def test_a_table_name_is_refused_exactly_when_torchrec_cannot_build_it(name):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    config = EmbeddingBagConfig(name=name, embedding_dim=4, num_embeddings=3, feature_names=["f"])
    try:
        EmbeddingBagCollection(tables=[config])
        builds = True
    except KeyError:
        builds = False
    d = _tiny_dict()
    d["tables"][1]["name"] = name
    try:
        parse_workload(d, "spec.json")
        accepted = True
    except UserError:
        accepted = False
    assert accepted == builds == (name in ("item_table", "users"))


def test_the_largest_table_allowed_loads():
    d = _tiny_dict()
    d["model"]["arch"] = "concat-mlp"
    d["tables"][0].update(num_embeddings=2**40, embedding_dim=2**16)
    assert parse_workload(d, "x").tables[0].num_embeddings == 2**40


def test_numbers_too_large_for_any_type_are_refused_in_one_line(write_json):
    d = _tiny_dict()
    d["tables"][0]["num_embeddings"] = 10**400
    with pytest.raises(UserError, match="got an integer of 401 digits"):
        parse_workload(d, "x.json")
    text = write_json(d, "big.json").read_text().replace("1" + "0" * 400, "9" * 5000)
    with pytest.raises(UserError, match="huge.json: unreadable JSON: Exceeds the limit"):
        load_workload(write_json(text, "huge.json"))


def test_zero_max_rows_is_refused_not_ignored():
    with pytest.raises(UserError, match="--max-rows must be positive, got 0"):
        load_workload("tiny").capped(0)


def test_format_doc_is_the_printed_format(cli):
    from conftest import ROOT

    code, out, _ = cli("workloads", "--format")
    assert code == 0 and out.startswith("# Workload specs")
    assert out == (ROOT / "docs" / "WORKLOADS.md").read_text()
    for key in (
        "num_embeddings",
        "pooling_factor",
        "zipf_alpha",
        "feature_names",
        "dcn_num_layers",
    ):
        assert f"`{key}`" in out
    assert "1..1,099,511,627,776 (2^40)" in out  # the limit parse_workload applies


def test_a_sequence_table_is_read_kept_and_fingerprinted_as_one(write_json):
    d = _tiny_dict()
    d["model"]["arch"] = "concat-mlp"
    d["tables"][1]["sequence"] = True
    spec = load_workload(write_json(d))
    assert [t.sequence for t in spec.tables[:3]] == [False, True, False]
    assert load_workload(write_json(spec.to_dict())).tables == spec.tables
    assert "sequence" not in spec.to_dict()["tables"][0]  # written only where true
    prints = spec.fingerprints()
    assert prints[1]["sequence"] is True and "sequence" not in prints[0]


def test_concat_mlp_allows_mixed_dims():
    d = _tiny_dict()
    d["model"]["arch"] = "concat-mlp"
    d["tables"][0]["embedding_dim"] = 16
    assert parse_workload(d, "x").tables[0].embedding_dim == 16


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--workload", "no-such-workload"], "unknown workload 'no-such-workload'"),
        (["--workload", "tiny", "--nproc", "0"], "--nproc must be in 1..1,024, got 0"),
    ],
)
def test_cli_bad_input_exit_2(cli, args, needle):
    code, _, err = cli("train", *args)
    assert code == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_malformed_json_and_bad_dims(cli, write_json):
    code, _, err = cli("train", "--workload", write_json('{"name": "x",', "broken.json"))
    assert code == 2 and "broken.json: malformed JSON at line 1" in err
    d = _tiny_dict()
    d["tables"][5]["embedding_dim"] = 8
    code, _, err = cli("train", "--workload", write_json(d, "dims.json"))
    assert (
        code == 2 and "dims.json" in err and "t5" in err and "dense_arch's last layer (32)" in err
    )


def test_cli_lists_workloads(cli):
    code, out, _ = cli("workloads")
    assert code == 0 and "criteo-kaggle" in out and "multihot-26" in out


def test_trainable_workloads_are_seeded_valid_specs_in_their_stated_ranges():
    """The held-out corpus `bench_tune_corpus` tunes: the same seed gives the same spec, each
    parses as a spec (the rules every user's file meets) and stays within its stated ranges."""
    from sparselift.optimizer.synthetic import trainable_workload

    specs = [trainable_workload(seed) for seed in range(20)]
    assert trainable_workload(3) == specs[3]
    assert len({json.dumps(s, sort_keys=True) for s in specs}) == 20
    for seed, d in enumerate(specs):
        spec = parse_workload(d, f"held-out-{seed}")
        assert 12 <= len(spec.tables) <= 24 and spec.batch_size in (512, 1024)
        for t in spec.tables:
            assert 1_000 <= t.num_embeddings <= 2_000_000 and 16 <= t.embedding_dim <= 128
            assert 1 <= t.pooling_factor <= 30 and 0.6 <= t.zipf_alpha <= 1.2


def test_varied_workloads_are_seeded_valid_specs_of_every_arch_in_their_stated_ranges():
    """The second held-out family (`bench_tune_corpus --family varied`): seeded, each a valid
    spec, within its stated ranges and caps, and drawing every arch and the rarer table kinds."""
    from sparselift.optimizer.synthetic import (
        VARIED_IDS_PER_STEP,
        VARIED_WEIGHT_BYTES,
        varied_workload,
    )

    specs = [parse_workload(varied_workload(seed), f"varied-{seed}") for seed in range(40)]
    assert varied_workload(7) == varied_workload(7) != varied_workload(8)
    assert {s.model.arch for s in specs} == {"dlrm", "dlrm-dcn", "concat-mlp"}
    tables = [t for s in specs for t in s.tables]
    assert any(len(t.features) == 2 for t in tables) and any(t.sequence for t in tables)
    assert any(t.data_type == "fp16" for t in tables)
    for s in specs:
        assert 4 <= len(s.tables) <= 28 and 128 <= s.batch_size <= 2048
        ids = sum(t.pooling_factor * len(t.features) for t in s.tables) * s.batch_size
        assert ids <= VARIED_IDS_PER_STEP or s.batch_size == 128
        weights = sum(
            t.num_embeddings * t.embedding_dim * (2 if t.data_type == "fp16" else 4)
            for t in s.tables
        )
        assert weights <= VARIED_WEIGHT_BYTES
        for t in s.tables:
            assert 1 <= t.pooling_factor <= 100 and 0.2 <= t.zipf_alpha <= 1.4
            assert 8 <= t.embedding_dim <= 256 and t.num_embeddings <= 4_000_000
