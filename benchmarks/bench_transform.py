"""What the batch transform of a split plan costs per batch: the committed (HEAD) transform and
the working tree's, timed interleaved on the same batches.

    .venv/bin/python benchmarks/bench_transform.py [--batches 20] [--rounds 5] [--rev b52468b]

Per workload (multihot-26, criteo-kaggle and benchmarks/workloads/skewed-multihot.json, ids
hashed into 200,000 rows, and benchmarks/workloads/one-heavy-table.json into 400,000, as
`bench_rewrites.py` runs them): rank 0's synthetic batches, as
`bench_rewrites.transform_s` draws them, through two plans' transforms: a hot/cold split of every
table whose hottest ids (counted on other batches of the same workload, seed 1) cover 50 % of
its lookups with at most 65,536 ids, as `bench_rewrites.hot_cold_plan` splits; and every table
of at least 2 rows in 2 row ranges at half its rows. One intra-op thread (a rank's share of the
2-core hosts). Each batch is transformed by the old and the new transform in turn (alternating
which goes first), their outputs are checked equal tensor for tensor, and the median per batch of
each is printed with old/new and the share of a measured step (`STEP_MS`).

The old transform is `git show REV:sparselift/plans/transform.py` (by default the last
per-feature transform, `PER_FEATURE_REV`) with that revision's `routing.py`, imported as modules
of their own; the new one is the package's.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sparselift.plans import Split
from sparselift.plans.splits import part_names
from sparselift.plans.transform import BatchTransform
from sparselift.plans.types import TableFingerprint
from sparselift.profiler.hot_ids import HOT_IDS_CAP
from sparselift.workloads.batches import SyntheticBatches
from sparselift.workloads.spec import load_workload

HERE = Path(__file__).resolve().parent
SKEWED = HERE / "workloads" / "skewed-multihot.json"
ONE_HEAVY = HERE / "workloads" / "one-heavy-table.json"
WORKLOADS = [
    ("multihot-26", 200_000),
    ("criteo-kaggle", 200_000),
    (str(SKEWED), 200_000),
    (str(ONE_HEAVY), 400_000),
]
COVERAGE = 0.5
PER_FEATURE_REV = "b52468b"  # the last commit whose transform routed feature by feature
# The measured step (ms) of each workload on the 2-core VM, 2 gloo ranks, TorchRec's plan
# (benchmarks/README.md): multihot-26 84.44 / 83.99 (bench_prediction, 2026-12-01);
# criteo-kaggle 302-323 (bench_prediction, six plans), the low end; skewed-multihot 8.24-9.91
# steps/s (bench_rewrites, 2026-12-01), the middle 8.83; one-heavy-table: its split plan's
# 84.5 ms (bench_rewrites, 2026-12-03; TorchRec's plan 105.0). Split plans step slower, so the
# share of their own step is lower still.
STEP_MS = {
    "multihot-26": 84.2,
    "criteo-kaggle": 302.0,
    "skewed-multihot": 113.0,
    "one-heavy-table": 84.5,
}


def old_transform_module(rev: str) -> Any:
    """The module `sparselift/plans/transform.py` at git revision `rev`, with the routing module
    of that revision where it had one (imported as `routing_old`)."""
    routing = _source(rev, "routing")
    if routing is not None:
        _module("routing_old", routing)
    src = (_source(rev, "transform") or "").replace(
        "from sparselift.plans.routing import", "from routing_old import"
    )
    return _module("transform_old", src)


def _source(rev: str, name: str) -> str | None:
    """`sparselift/plans/NAME.py` at git revision `rev`; None where it had no such file."""
    r = subprocess.run(
        ["git", "show", f"{rev}:sparselift/plans/{name}.py"],
        cwd=HERE.parent, capture_output=True, text=True,
    )  # fmt: skip
    return r.stdout if r.returncode == 0 else None


def _module(name: str, src: str) -> Any:
    """`src` imported as module `name`."""
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def hot_ids(model: list[TableFingerprint], batches: list[Any]) -> dict[str, tuple[int, ...]]:
    """Per table the fewest hottest ids covering COVERAGE of its lookups in `batches` (at most
    HOT_IDS_CAP and fewer than all rows; tables without such a set are left out)."""
    out = {}
    for t in model:
        counts = torch.zeros(t.num_embeddings, dtype=torch.int64)
        for b in batches:
            for f in t.feature_names:
                counts += torch.bincount(b.sparse_features[f].values(), minlength=t.num_embeddings)
        order = torch.argsort(counts, descending=True, stable=True)
        covered = torch.cumsum(counts[order], 0)
        k = int(torch.searchsorted(covered, COVERAGE * int(counts.sum()))) + 1
        if k <= HOT_IDS_CAP and k < t.num_embeddings:
            out[t.name] = tuple(order[:k].tolist())
    return out


def plans_of(workload: str, max_rows: int) -> tuple[list[TableFingerprint], dict[str, list[Split]]]:
    """The capped model and its two split sets: "hot_cold" and "row_ranges"."""
    spec = load_workload(workload)
    model = [TableFingerprint.from_any(t) for t in spec.capped(max_rows).fingerprints()]
    gen = iter(SyntheticBatches(spec, rank=0, seed=1, max_rows=max_rows))
    hot = hot_ids(model, [next(gen) for _ in range(10)])
    hot_cold = [
        Split(n, "hot_cold", part_names(n, "hot_cold"), hot_ids=ids) for n, ids in hot.items()
    ]
    ranges = [
        Split(t.name, "row_ranges", part_names(t.name, "row_ranges"),
              ranges=((0, t.num_embeddings // 2), (t.num_embeddings // 2, t.num_embeddings)))
        for t in model
        if t.num_embeddings >= 2
    ]  # fmt: skip
    return model, {"hot_cold": hot_cold, "row_ranges": ranges}


def same(a: Any, b: Any) -> bool:
    """Whether two KJTs are equal tensor for tensor (keys, values, lengths, weights, dtypes)."""
    wa, wb = a.weights_or_none(), b.weights_or_none()
    return (
        a.keys() == b.keys()
        and a.values().dtype == b.values().dtype
        and torch.equal(a.values(), b.values())
        and a.lengths().dtype == b.lengths().dtype
        and torch.equal(a.lengths(), b.lengths())
        and (wa is None) == (wb is None)
        and (wa is None or torch.equal(wa, wb))
    )


def time_pair(old: Any, new: Any, kjts: list[Any], rounds: int) -> tuple[float, float]:
    """Median seconds per batch of `old` and `new`, interleaved batch by batch."""
    if not same(old(kjts[0]), new(kjts[0])):  # also builds both transforms' routes
        raise SystemExit("the old and the new transform disagree")
    t_old, t_new = [], []
    for r in range(rounds):
        for i, k in enumerate(kjts):
            for which in (0, 1) if (i + r) % 2 == 0 else (1, 0):
                f, ts = (old, t_old) if which == 0 else (new, t_new)
                t0 = time.perf_counter()
                f(k)
                ts.append(time.perf_counter() - t0)
    for k in kjts:
        if not same(old(k), new(k)):
            raise SystemExit("the old and the new transform disagree")
    return statistics.median(t_old), statistics.median(t_new)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rev", default=PER_FEATURE_REV, help="git revision of the old transform")
    a = ap.parse_args(argv)
    old_mod = old_transform_module(a.rev)
    torch.set_num_threads(1)
    print(f"{'workload':16s} {'splits':10s} {'n':>3s} {'hot ids':>7s} {'ids/batch':>9s} "
          f"{'old ms':>7s} {'new ms':>7s} {'old/new':>7s} {'share old':>9s} "
          f"{'share new':>9s}")  # fmt: skip
    for workload, rows in WORKLOADS:
        name = Path(workload).stem
        model, variants = plans_of(workload, rows)
        gen = iter(SyntheticBatches(load_workload(workload), rank=0, seed=0, max_rows=rows))
        kjts = [next(gen).sparse_features for _ in range(a.batches)]
        n_ids = statistics.median(k.values().numel() for k in kjts)
        for kind, splits in variants.items():
            old = old_mod.BatchTransform(model, splits, "old")
            new = BatchTransform(model, splits, "new")
            t_old, t_new = time_pair(old, new, kjts, a.rounds)
            step = STEP_MS[name]
            print(
                f"{name:16s} {kind:10s} {len(splits):3d} {sum(len(s.hot_ids) for s in splits):7d} "
                f"{n_ids:9.0f} {1e3 * t_old:7.2f} "
                f"{1e3 * t_new:7.2f} {t_old / t_new:7.2f} {100 * t_old * 1e3 / step:8.2f}% "
                f"{100 * t_new * 1e3 / step:8.2f}%",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
