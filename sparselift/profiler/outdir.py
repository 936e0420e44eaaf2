"""The profile directory: refusing to mix runs, and writing its files atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from sparselift.atomic import file_in_the_way, parquet_bytes, write_bytes
from sparselift.errors import UserError

MANIFEST = "manifest.json"
ACCESS_STATS = "access_stats.parquet"


def prepare_out_dir(path: str | Path, force: bool) -> Path:
    """Create the profile directory `path` (and its parents), and check that it takes a file.

    Args:
        path: the directory.
        force: accept a non-empty directory (the caller replaces the profile there).
    Returns:
        The directory, created.
    Raises:
        UserError: `path` is a file or below one, is not empty (without `force`), or cannot be
            created or written.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: exists and is not a directory")
    blocking = file_in_the_way(out)
    if blocking is not None:
        raise UserError(f"cannot write {out}: {blocking} is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(
            f"--out {out}: directory exists and is not empty (use --force to overwrite)"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"--out {out}: cannot write there: {e.strerror or e}") from None
    return out


def write_access_stats(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """access_stats.parquet with the contract's columns, in order, even when there are no rows."""
    import pandas as pd

    from sparselift.profiler.access_stats import COLUMNS

    df = pd.DataFrame(rows, columns=list(COLUMNS))
    dtypes = {
        "table": "string",
        "rank": "int64",
        "step": "int64",
        "num_embeddings": "int64",
        "embedding_dim": "int64",
        "batch_size": "int64",
        "ids": "int64",
        "unique_ids": "int64",
        "pooling_max": "int64",
        "id_bytes": "int64",
    }
    df = df.astype({**{c: "float64" for c in COLUMNS}, **dtypes})
    write_bytes(path, parquet_bytes(df))
