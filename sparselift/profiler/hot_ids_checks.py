"""The checks `hot_ids.read_hot_ids` runs on a profile's hot-id file and its manifest summaries.

Why a module of its own: everything `hot_ids.parquet` and the manifest's `hot_ids` summaries can
get wrong (a missing key, a wrong type, an id outside the table, rows out of order, counts that
disagree with the summary) is bad input, refused here with one `UserError` line naming the file
and the table, so the reader itself stays a short walk over the tables.

The format's columns (`COLUMNS`) and summary keys (`SUMMARY_KEYS`) are defined here, where they
are checked; `hot_ids` documents the format. Imports numpy (pyarrow where a file is read), not
torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sparselift.errors import UserError

if TYPE_CHECKING:
    from sparselift.profiler.hot_ids import HotIds

COLUMNS = ("table", "id", "count")
SUMMARY_KEYS = ("lookups", "distinct_ids", "kept", "kept_lookups", "coverage", "cap", "capped")


def manifest_int(v: Any, key: str, table: str, mpath: Path, low: int = 0) -> int:
    """`v`, `key` of `table` in the manifest `mpath`: an integer >= `low`, else UserError."""
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UserError(f"{mpath}: table {table!r}: {key} {v!r} is not an integer >= {low}")
    return v


def checked_summary(entry: dict[str, Any], table: str, mpath: Path) -> dict[str, Any]:
    """A manifest entry's hot_ids summary, its keys and types checked."""
    s = entry["hot_ids"]
    missing = [k for k in SUMMARY_KEYS if not isinstance(s, dict) or k not in s]
    if missing:
        raise UserError(f"{mpath}: table {table!r}: hot_ids lacks {', '.join(missing)}")
    out = {k: manifest_int(s[k], k, table, mpath) for k in ("lookups", "distinct_ids", "kept")}
    out["kept_lookups"] = manifest_int(s["kept_lookups"], "kept_lookups", table, mpath)
    out["cap"] = manifest_int(s["cap"], "cap", table, mpath, low=1)
    cov = s["coverage"]
    if isinstance(cov, bool) or not isinstance(cov, (int, float)) or not 0 < cov <= 1:
        raise UserError(f"{mpath}: table {table!r}: hot_ids coverage {cov!r} is not in (0, 1]")
    if not isinstance(s["capped"], bool):
        raise UserError(f"{mpath}: table {table!r}: hot_ids capped {s['capped']!r} is not a bool")
    if out["kept_lookups"] > out["lookups"] or out["kept"] > out["distinct_ids"]:
        raise UserError(
            f"{mpath}: table {table!r}: hot_ids keeps more than it counted "
            f"({out['kept']} of {out['distinct_ids']} ids, "
            f"{out['kept_lookups']} of {out['lookups']} lookups)"
        )
    return {**out, "coverage": float(cov), "capped": s["capped"]}


def read_groups(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The file's (ids, counts) per table; the columns' types and the table order checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        tbl = pq.read_table(path)
    except Exception as e:  # any unreadable parquet is bad input, whatever pyarrow raises
        raise UserError(f"{path}: unreadable Parquet ({e.__class__.__name__})") from None
    missing = [c for c in COLUMNS if c not in tbl.column_names]
    if missing:
        raise UserError(f"{path}: missing columns {', '.join(missing)}")
    for c in COLUMNS:
        if tbl.column(c).null_count:
            raise UserError(f"{path}: column {c!r} holds nulls")
    col = tbl.column("table").combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise UserError(f"{path}: column 'table' is {col.type}, not strings")
    for c in ("id", "count"):
        if not pa.types.is_integer(tbl.column(c).type):
            raise UserError(f"{path}: column {c!r} is {tbl.column(c).type}, not integers")
    enc = col.dictionary_encode()
    idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names = enc.dictionary.to_pylist()
    if np.any(np.diff(idx) < 0) or names != sorted(names):
        raise UserError(f"{path}: rows not sorted by table")
    ids = tbl.column("id").to_numpy().astype(np.int64)
    counts = tbl.column("count").to_numpy().astype(np.int64)
    bounds = np.searchsorted(idx, np.arange(len(names) + 1), side="left")
    return {
        name: (ids[bounds[i] : bounds[i + 1]], counts[bounds[i] : bounds[i + 1]])
        for i, name in enumerate(names)
    }


def check_rows(hot: HotIds, s: dict[str, Any], path: Path) -> None:
    """One table's rows: ids inside the table, counts >= 1, ordered, agreeing with the summary."""
    where = f"{path}: table {hot.table!r}"
    ids, counts, n = hot.ids, hot.counts, hot.num_embeddings
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise UserError(f"{where}: id {bad} outside 0..{n - 1} (num_embeddings {n:,})")
    if counts.size and counts.min() < 1:
        raise UserError(f"{where}: count {int(counts.min())} is below 1")
    if np.unique(ids).size < ids.size:
        raise UserError(f"{where}: an id appears more than once")
    ordered = (counts[:-1] > counts[1:]) | ((counts[:-1] == counts[1:]) & (ids[:-1] < ids[1:]))
    if not ordered.all():
        row = int(np.argmin(ordered)) + 1
        raise UserError(
            f"{where}: rows not by count descending, then id ascending (its row {row} of "
            f"{ids.size})"
        )
    if ids.size != s["kept"] or hot.kept_lookups != s["kept_lookups"]:
        raise UserError(
            f"{where}: {ids.size} ids with {hot.kept_lookups} lookups, the manifest's summary "
            f"says {s['kept']} with {s['kept_lookups']} (files from different runs mixed?)"
        )
