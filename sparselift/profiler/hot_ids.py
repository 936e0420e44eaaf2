"""The hottest ids of each table, by measured frequency: `hot_ids.parquet` (written, read, checked).

Why: a table's hottest rows can be split off into a small replicated table; how many to split off
is the optimizer's choice among hot sizes (the ids covering e.g. 25 / 50 / 75 / 90 % of the
table's lookups), so the profile keeps the ids themselves, hottest first, with their counts.

Recorded over the profiled window, on all ranks together: the id histograms the access statistics
already merge on rank 0 (`access_stats.table_histograms`, sparse: only the ids seen). Per table the
most frequent ids are kept until they cover `HOT_IDS_COVERAGE` of the table's lookups, at most
`HOT_IDS_CAP` of them. The file: columns `table` (string), `id`, `count` (int64), sorted by table,
then count descending, then id ascending. Each manifest `tables` entry's `hot_ids` summary
(`HotIds.summary`) says what the rows are a part of: every lookup counted, every distinct id seen,
whether the cap cut the set short; the entry's `num_embeddings` is the table's size when recorded.

The optimizer reads them through `read_hot_ids` (its checks of the file against the manifest are
in `hot_ids_checks`) and refuses a stale profile with `check_table_size`; this module itself
imports only numpy (pyarrow where a file is read or written), not torch.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from sparselift.errors import UserError
from sparselift.profiler.hot_ids_checks import (
    COLUMNS,
    SUMMARY_KEYS,
    check_rows,
    checked_summary,
    manifest_int,
    read_groups,
)

HOT_IDS = "hot_ids.parquet"
HOT_IDS_COVERAGE = 0.9  # keep the hottest ids until they cover this share of lookups
# At most this many ids per table: a replicated hot table of 65,536 rows of dim 128 in fp32 is
# 32 MiB on every rank, about the most a "small" replicated table should hold; it also bounds the
# file (two int64 per id).
HOT_IDS_CAP = 65_536

# Re-exported: the format's columns and summary keys are defined where they are checked.
__all__ = [
    "COLUMNS",
    "HOT_IDS",
    "HOT_IDS_CAP",
    "HOT_IDS_COVERAGE",
    "SUMMARY_KEYS",
    "HotIds",
    "check_table_size",
    "ids_to_cover",
    "read_hot_ids",
    "record_hot_ids",
    "select_hot",
    "write_hot_ids",
]


@dataclass(frozen=True, eq=False)
class HotIds:
    """One table's hottest ids over the profiled window, hottest first.

    Attributes:
        table: the table's name.
        ids: int64 row ids, by count descending, then id ascending.
        counts: int64 lookups of each id (all ranks, all profiled steps), same order.
        lookups: every lookup of the table counted in the window (kept ids or not).
        distinct_ids: distinct ids seen in the window.
        num_embeddings: the table's rows when recorded (the ids index into it).
        capped: the cap stopped the ids short of the coverage target.
        coverage: the share of lookups the ids were kept to cover (the target).
        cap: the most ids kept per table when recorded.
    """

    table: str
    ids: np.ndarray
    counts: np.ndarray
    lookups: int
    distinct_ids: int
    num_embeddings: int
    capped: bool
    coverage: float = HOT_IDS_COVERAGE
    cap: int = HOT_IDS_CAP

    @property
    def kept_lookups(self) -> int:
        """Lookups that hit the kept ids."""
        return int(self.counts.sum())

    def covered_share(self, k: int) -> float:
        """The share of the table's lookups that hit its `k` hottest recorded ids (0.0 without
        lookups; `k` beyond the recorded ids counts them all)."""
        if self.lookups == 0 or k <= 0:
            return 0.0
        return int(self.counts[:k].sum()) / self.lookups

    def ids_covering(self, share: float) -> int | None:
        """The fewest hottest ids whose lookups are at least `share` of the table's lookups.

        Returns:
            That number (0 for share 0), or None where the recorded ids cover less than `share`
            (above the coverage target, cut short by the cap, or no lookups at all).
        Raises:
            ValueError: `share` is outside [0, 1].
        """
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share must be in [0, 1], got {share}")
        return ids_to_cover(self.counts, self.lookups, share)

    def summary(self) -> dict[str, Any]:
        """The manifest `tables` entry's `hot_ids` object (keys `SUMMARY_KEYS`)."""
        return dict(
            lookups=self.lookups,
            distinct_ids=self.distinct_ids,
            kept=int(self.ids.size),
            kept_lookups=self.kept_lookups,
            coverage=self.coverage,
            cap=self.cap,
            capped=self.capped,
        )


def ids_to_cover(counts_desc: np.ndarray, total: int, share: float) -> int | None:
    """The fewest leading entries of `counts_desc` (counts, largest first) summing to at least
    `share` · `total`, counted exactly (0.7 of 10 lookups is 7, not 8); None if all fall short,
    or if there were no lookups (`total` 0) and `share` is above 0."""
    if total <= 0:
        return 0 if share <= 0 else None
    need = math.ceil(Fraction(repr(float(share))) * int(total))
    if need <= 0:
        return 0
    cum = np.cumsum(counts_desc, dtype=np.int64)
    if cum.size == 0 or cum[-1] < need:
        return None
    return int(np.searchsorted(cum, need, side="left")) + 1


def select_hot(
    table: str,
    uniq: np.ndarray,
    counts: np.ndarray,
    num_embeddings: int,
    *,
    coverage: float = HOT_IDS_COVERAGE,
    cap: int = HOT_IDS_CAP,
) -> HotIds:
    """A table's hot ids from its id histogram over the window.

    Only the `cap` most frequent ids (and those tied with the last of them) are sorted, so a
    histogram of millions of distinct ids costs a partition, not a full sort.

    Args:
        table: the table's name.
        uniq: distinct ids seen (any order, no repeats).
        counts: lookups of each, same order, all positive.
        num_embeddings: the table's rows.
        coverage: keep the hottest ids until they cover this share of the lookups.
        cap: keep at most this many.
    Returns:
        The hot ids, by count descending then id ascending.
    """
    uniq = np.asarray(uniq, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    lookups, distinct = int(counts.sum()), int(uniq.size)
    if uniq.size > cap:  # every id at least as frequent as the cap-th most frequent one
        threshold = np.partition(counts, uniq.size - cap)[uniq.size - cap]
        keep = counts >= threshold
        uniq, counts = uniq[keep], counts[keep]
    order = np.lexsort((uniq, -counts))  # the last key sorts first
    uniq, counts = uniq[order], counts[order]
    k = ids_to_cover(counts, lookups, coverage) if lookups else 0
    if k is None:  # the candidates (at least `cap`) fall short: more than `cap` are needed
        k = cap + 1
    capped = k > cap
    k = min(k, cap)
    return HotIds(
        table=table,
        ids=uniq[:k].copy(),
        counts=counts[:k].copy(),
        lookups=lookups,
        distinct_ids=distinct,
        num_embeddings=int(num_embeddings),
        capped=capped,
        coverage=coverage,
        cap=cap,
    )


def record_hot_ids(
    out_dir: str | Path, tables: list[Any], histograms: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Rank 0 at the end of the window: every table's hot ids into `out_dir`/hot_ids.parquet.

    Args:
        out_dir: the profile directory.
        tables: the tables (`access.TableMeta`: name, num_embeddings); one without a histogram
            was not looked up and keeps no ids.
        histograms: each table's (ids, counts) over the window, tensors or arrays
            (`access_stats.table_histograms`).
    Returns:
        Each table's summary (`HotIds.summary`), for the manifest.
    Raises:
        UnwritablePathError: the file cannot be written.
    """
    empty = np.empty(0, dtype=np.int64)
    hots: list[HotIds] = []
    for t in tables:
        if any(h.table == t.name for h in hots):  # a name twice (two modules): recorded once
            continue
        ids, counts = histograms.get(t.name, (empty, empty))
        hots.append(select_hot(t.name, np.asarray(ids), np.asarray(counts), t.num_embeddings))
    write_hot_ids(Path(out_dir, HOT_IDS), hots)
    return {h.table: h.summary() for h in hots}


def write_hot_ids(path: str | Path, hots: list[HotIds]) -> Path:
    """`hot_ids.parquet` of `hots` at `path`, atomically (tables sorted by name, rows as kept).

    Returns:
        `path`.
    Raises:
        UnwritablePathError: the path cannot be written; nothing is left behind.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sparselift.atomic import write_bytes

    hots = sorted(hots, key=lambda h: h.table)
    sizes = np.array([h.ids.size for h in hots], dtype=np.int64)
    names = pa.array([h.table for h in hots], pa.string())
    table = pa.table(
        {
            "table": names.take(pa.array(np.repeat(np.arange(len(hots)), sizes))),
            "id": pa.array(_cat([h.ids for h in hots]), pa.int64()),
            "count": pa.array(_cat([h.counts for h in hots]), pa.int64()),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    write_bytes(path, buf.getvalue())
    return Path(path)


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.empty(0, dtype=np.int64)


def read_hot_ids(profile_dir: str | Path) -> dict[str, HotIds]:
    """Every table's hot ids in a profile directory, checked against its manifest.

    Args:
        profile_dir: the profile directory (manifest.json and the hot_ids.parquet it lists).
    Returns:
        Per table with a `hot_ids` summary in the manifest, in manifest order, its HotIds (no
        ids for a table without lookups).
    Raises:
        UserError: one line naming the file (and the table) — the manifest is missing or lists
            no hot ids (a profile made before they were recorded, or their recording failed),
            the file is missing or unreadable, lacks a column, holds a table the manifest does
            not, an id outside the table, a repeated id, a count below 1, rows out of order, or
            rows and counts that disagree with the manifest's summary.
    """
    from sparselift.jsonfile import read_versioned
    from sparselift.profiler.manifest import FORMAT, VERSION

    d = Path(profile_dir)
    mpath = d / "manifest.json"
    if not mpath.is_file():
        raise UserError(f"{mpath}: missing (not a sparselift profile directory)")
    manifest = read_versioned(mpath, FORMAT, VERSION, "profile manifest")
    listed = (manifest.get("files") or {}).get("hot_ids")
    if not isinstance(listed, str) or not listed:
        raise UserError(
            f"{d / HOT_IDS}: not recorded in this profile (made before hot ids were recorded, or "
            f"recording them failed: see {mpath.name}'s errors); profile the job again"
        )
    path = d / Path(listed).name
    if not path.is_file():
        raise UserError(f"{path}: missing ({mpath.name} lists it)")
    entries = {
        t["name"]: t
        for t in manifest.get("tables") or []
        if isinstance(t, dict) and isinstance(t.get("name"), str)
    }
    summaries = {
        name: checked_summary(t, name, mpath)
        for name, t in entries.items()
        if t.get("hot_ids") is not None
    }
    groups = read_groups(path)
    out: dict[str, HotIds] = {}
    for name in groups:
        if name not in entries:
            raise UserError(
                f"{path}: table {name!r} is not among {mpath.name}'s tables "
                f"(files from different runs mixed?)"
            )
        if name not in summaries:
            raise UserError(
                f"{mpath}: table {name!r} has rows in {path.name} but no hot_ids summary"
            )
    for name, s in summaries.items():
        ids, counts = groups.get(name, (np.empty(0, np.int64), np.empty(0, np.int64)))
        hot = HotIds(
            table=name,
            ids=ids,
            counts=counts,
            lookups=s["lookups"],
            distinct_ids=s["distinct_ids"],
            num_embeddings=manifest_int(
                entries[name].get("num_embeddings"), "num_embeddings", name, mpath
            ),
            capped=s["capped"],
            coverage=s["coverage"],
            cap=s["cap"],
        )
        check_rows(hot, s, path)
        out[name] = hot
    return out


def check_table_size(hot: HotIds, table: str, num_embeddings: int) -> None:
    """Refuse hot ids recorded for another size of `table` (a stale profile).

    Raises:
        UserError: the sizes differ; names the table and both sizes.
    """
    if hot.num_embeddings != int(num_embeddings):
        raise UserError(
            f"table {table!r}: its hot ids were profiled with {hot.num_embeddings:,} rows but "
            f"the table has {int(num_embeddings):,} (stale profile: profile the job again)"
        )
