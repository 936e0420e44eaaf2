"""Model builders train unsharded; real Criteo .npy day files feed the same models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor

from sparselift.errors import UserError
from sparselift.optimizer.table_stats import stats_from_spec
from sparselift.workloads import load_workload
from sparselift.workloads.batches import SyntheticBatches
from sparselift.workloads.criteo import criteo_batches, day_files
from sparselift.workloads.models import build_model, sequence_mean
from sparselift.workloads.spec import parse_workload, sequence_collection


@pytest.mark.parametrize("arch", ["dlrm", "dlrm-dcn", "concat-mlp", "concat-mlp+sequence"])
def test_every_arch_learns_a_step(arch):
    spec = load_workload("tiny")
    tables = spec.tables
    if arch.startswith("concat-mlp"):  # mixed dims are what concat-mlp is for
        tables = tuple(
            dataclasses.replace(
                t, embedding_dim=8 * (1 + i % 3), sequence=arch.endswith("e") and i < 2
            )
            for i, t in enumerate(tables)
        )
        arch = "concat-mlp"
    spec = dataclasses.replace(
        spec, tables=tables, model=dataclasses.replace(spec.model, arch=arch, dcn_low_rank_dim=8)
    )
    torch.manual_seed(0)
    model = build_model(spec, embedding_device=torch.device("cpu"))
    batch = SyntheticBatches(spec, seed=0, batch_size=32).next_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss0, (_, logits, labels) = model(batch)
    assert logits.shape == labels.shape == (32,)
    for _ in range(5):
        opt.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        opt.step()
    assert loss.item() < loss0.item()


def test_sequence_tables_live_in_an_embedding_collection_and_are_averaged_per_sample():
    d = load_workload("tiny").to_dict()
    d["model"]["arch"] = "concat-mlp"
    d["tables"][1]["sequence"] = True
    d["tables"][4].update(sequence=True, embedding_dim=16)  # another dim: its own collection
    spec = parse_workload(d, "seq.json")
    model = build_model(spec, embedding_device=torch.device("cpu"))
    collections = {
        name: [c.name for c in (m.embedding_configs() if hasattr(m, "embedding_configs") else [])]
        for name, m in model.named_modules()
        if isinstance(m, (EmbeddingCollection, EmbeddingBagCollection))
    }
    # where the optimizer's what-if statistics say the sequence tables are
    assert collections[sequence_collection(32)] == ["t1"]
    assert collections[sequence_collection(16)] == ["t4"]
    stats = {s.name: s for s in stats_from_spec(spec)}
    assert stats["t1"].sequence and stats["t1"].collection == sequence_collection(32)
    assert stats["t4"].collection == sequence_collection(16)
    assert not stats["t0"].sequence and stats["t0"].collection is None
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]])
    jt = JaggedTensor(values=values, lengths=torch.tensor([2, 0, 1]))
    assert sequence_mean(jt).tolist() == [[2.0, 3.0], [0.0, 0.0], [5.0, 9.0]]


def write_criteo_day(root, day: int, n: int, seed: int = 0) -> None:
    """One day in TorchRec's preprocessed format (what BinaryCriteoUtils writes)."""
    rng = np.random.default_rng(seed)
    np.save(root / f"day_{day}_dense.npy", rng.random((n, 13), dtype=np.float32))
    np.save(
        root / f"day_{day}_sparse.npy",
        rng.integers(0, 2**31 - 1, (n, 26), dtype=np.int64).astype(np.int32),
    )
    np.save(root / f"day_{day}_labels.npy", rng.integers(0, 2, (n, 1)).astype(np.int32))


def test_criteo_day_files_are_read_and_hashed(tmp_path):
    write_criteo_day(tmp_path, 0, 300)
    write_criteo_day(tmp_path, 1, 300, seed=1)
    tables = load_workload("criteo-kaggle").capped(1000).tables
    it = criteo_batches(
        tmp_path, batch_size=64, rank=1, world_size=2, table_rows=[t.num_embeddings for t in tables]
    )
    seen = [next(it) for _ in range(12)]  # more than one pass: the stream is endless
    b = seen[0]
    assert b.dense_features.shape == (64, 13) and b.labels.shape == (64,)
    assert b.sparse_features.keys() == [f"cat_{i}" for i in range(26)]
    for t in tables:  # every feature's ids fit its own table, small ones (cat_5: 24 rows) too
        assert int(b.sparse_features[t.name].values().max()) < t.num_embeddings, t.name
    assert torch.equal(
        b.sparse_features.lengths(), torch.ones(64 * 26, dtype=b.sparse_features.lengths().dtype)
    )
    raw = np.load(tmp_path / "day_0_dense.npy")
    np.testing.assert_array_equal(
        b.dense_features.numpy(), raw[64:128]
    )  # rank 1 reads its own share


def test_criteo_bad_directories(tmp_path):
    with pytest.raises(UserError, match="no day_<N>_dense.npy"):
        day_files(tmp_path)
    write_criteo_day(tmp_path, 0, 10)
    (tmp_path / "day_0_labels.npy").unlink()
    with pytest.raises(UserError, match="day 0 has no day_0_labels.npy"):
        day_files(tmp_path)
