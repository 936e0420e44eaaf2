"""Real Criteo input: TorchRec's preprocessed `.npy` day files, instead of synthetic batches.

The files are those `torchrec.datasets.criteo.BinaryCriteoUtils` writes (`day_<N>_dense.npy`,
`day_<N>_sparse.npy`, `day_<N>_labels.npy`); reading and hashing is TorchRec's own
`InMemoryBinaryCriteoIterDataPipe`. Features are named `cat_0` … `cat_25`, as in `criteo-kaggle`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from torchrec.datasets.criteo import CAT_FEATURE_COUNT, InMemoryBinaryCriteoIterDataPipe
from torchrec.datasets.utils import Batch

from sparselift.errors import UserError

_DAY = re.compile(r"day_(\d+)_dense\.npy$")


class CriteoDays(NamedTuple):
    """The files of the complete days of a Criteo directory, three lists in day order."""

    dense: list[str]
    sparse: list[str]
    labels: list[str]


def day_files(data_dir: str | Path) -> CriteoDays:
    """The dense, sparse and label files of every complete day in `data_dir`.

    Raises:
        UserError: not a directory, no day files, or a day without all three files.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise UserError(f"--data {root}: not a directory")
    days = sorted(int(m.group(1)) for p in root.iterdir() if (m := _DAY.search(p.name)))
    if not days:
        raise UserError(
            f"--data {root}: no day_<N>_dense.npy files (TorchRec's preprocessed Criteo format)"
        )
    paths = CriteoDays([], [], [])
    for d in days:
        for kind, out in zip(CriteoDays._fields, paths, strict=True):
            p = root / f"day_{d}_{kind}.npy"
            if not p.is_file():
                raise UserError(f"--data {root}: day {d} has no {p.name}")
            out.append(str(p))
    return paths


def criteo_batches(
    data_dir: str | Path, batch_size: int, rank: int, world_size: int, table_rows: Sequence[int]
) -> Iterator[Batch]:
    """Endless batches of this rank's share of the days.

    Args:
        data_dir: the directory of day files.
        batch_size: samples per rank.
        rank: this rank.
        world_size: ranks sharing the days.
        table_rows: rows of each table, in feature order cat_0 … cat_25; each feature's ids are
            hashed into its table's rows.
    Raises:
        UserError: not 26 tables, a bad directory, or fewer samples than one batch per rank.
    """
    if len(table_rows) != CAT_FEATURE_COUNT:
        raise UserError(
            f"--data needs a workload with {CAT_FEATURE_COUNT} tables (Criteo's cat_0 … cat_25), "
            f"got {len(table_rows)}"
        )
    dense, sparse, labels = day_files(data_dir)
    pipe = InMemoryBinaryCriteoIterDataPipe(
        stage="train",
        dense_paths=dense,
        sparse_paths=sparse,
        labels_paths=labels,
        batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        drop_last=True,
        hashes=list(table_rows),
    )
    if len(pipe) == 0:
        raise UserError(
            f"--data {data_dir}: fewer than {batch_size * world_size} samples "
            f"for one batch per rank"
        )
    return itertools.chain.from_iterable(itertools.repeat(pipe))
