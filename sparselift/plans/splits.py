"""Virtual tables (plan format 2): what a split makes of a model table, and the checks on splits.

A split rewrites one model table as virtual tables ("parts"), each sharded like any table. Every
feature f of the table becomes one virtual feature per part, `virtual_feature(f, part)`; the
loader's batch transform routes f's ids to them and the rewritten model recombines their pooled
embeddings (summed for row splits, concatenated for column slices), so training is unchanged.

Pure data and checks: no torch here, so that reading and checking a plan stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sparselift.plans.types import SPLIT_KINDS, Split, TableFingerprint

# The member of a split's JSON object that holds each kind's ranges ("hot_cold": hot_ids).
RANGES_KEY = {"row_ranges": "row_ranges", "column_slices": "column_slices"}
PART_SUFFIX = {"hot_cold": ("hot", "cold"), "row_ranges": "rows", "column_slices": "cols"}
SHOWN = 3  # offending ids a message names before "(N in all)"


def virtual_feature(feature: str, part: str) -> str:
    """The feature that carries `feature`'s ids to virtual table `part`."""
    return f"{feature}/{part}"


def part_names(table: str, kind: str, n: int = 2) -> tuple[str, ...]:
    """Conventional names of the `n` parts of a `kind` split of `table` (what writers use).

    hot_cold: (`table__hot`, `table__cold`); row_ranges: `table__rows0`, …; column_slices:
    `table__cols0`, …. Raises ValueError for an unknown kind.
    """
    if kind == "hot_cold":
        return tuple(f"{table}__{s}" for s in PART_SUFFIX["hot_cold"])
    if kind in RANGES_KEY:
        return tuple(f"{table}__{PART_SUFFIX[kind]}{i}" for i in range(n))
    raise ValueError(f"unknown split kind {kind!r} (one of {', '.join(SPLIT_KINDS)})")


def split_to_dict(s: Split) -> dict[str, Any]:
    """The split's object in the plan file: table, kind, parts, then hot_ids or its ranges."""
    out: dict[str, Any] = {"table": s.table, "kind": s.kind, "parts": list(s.parts)}
    if s.kind == "hot_cold":
        out["hot_ids"] = list(s.hot_ids)
    else:
        out[RANGES_KEY[s.kind]] = [list(r) for r in s.ranges]
    return out


def split_from_dict(d: dict[str, Any], i: int) -> tuple[Split, list[str]]:
    """A schema-valid split object as a Split, and what its kind does not allow.

    Returns:
        The split (ints as Python ints) and one message per member that its kind lacks or
        does not take, naming `splits[i]`.
    """
    kind = d["kind"]
    where = f"splits[{i}] ({d['table']!r})"
    wanted = "hot_ids" if kind == "hot_cold" else RANGES_KEY[kind]
    problems = [] if wanted in d else [f"{where}: {kind} needs {wanted}"]
    problems += [
        f"{where}: {kind} takes no {k}"
        for k in ("hot_ids", *RANGES_KEY.values())
        if k in d and k != wanted
    ]
    ranges = tuple((int(a), int(b)) for a, b in d.get(wanted, [])) if kind != "hot_cold" else ()
    split = Split(
        table=d["table"],
        kind=kind,
        parts=tuple(d["parts"]),
        hot_ids=tuple(int(x) for x in d.get("hot_ids", [])) if kind == "hot_cold" else (),
        ranges=ranges,
    )
    return split, problems


def part_fingerprints(s: Split, fp: TableFingerprint) -> list[TableFingerprint]:
    """The virtual tables of split `s` of table `fp`, in part order.

    hot_cold: the hot part has len(hot_ids) rows, the cold part all of the table's rows (its hot
    rows are never looked up there, which keeps cold ids unchanged and checkpoints exact).
    """
    rows, dim = fp.num_embeddings, fp.embedding_dim
    if s.kind == "hot_cold":
        shapes = [(len(s.hot_ids), dim), (rows, dim)]
    elif s.kind == "row_ranges":
        shapes = [(b - a, dim) for a, b in s.ranges]
    else:
        shapes = [(rows, b - a) for a, b in s.ranges]
    return [
        TableFingerprint(
            name=part,
            num_embeddings=n,
            embedding_dim=d,
            feature_names=tuple(virtual_feature(f, part) for f in fp.feature_names),
            module=fp.module,
            data_type=fp.data_type,
        )
        for part, (n, d) in zip(s.parts, shapes, strict=False)
    ]


def sharded_tables(model: list[TableFingerprint], splits: list[Split]) -> list[TableFingerprint]:
    """The tables as sharded: model order, each split table replaced by its parts."""
    by_table = {s.table: s for s in splits}
    out: list[TableFingerprint] = []
    for fp in model:
        s = by_table.get(fp.name)
        out += part_fingerprints(s, fp) if s is not None else [fp]
    return out


def split_problems(splits: list[Split], model: list[TableFingerprint]) -> list[str]:
    """Every problem of a plan's splits against its model, each naming the split and table.

    Returns:
        [] when every split names a model table once, its parts are new names TorchRec accepts,
        and its hot ids or ranges fit the table.
    """
    fps = {t.name: t for t in model}
    model_features = {f for t in model for f in t.feature_names}
    seen_tables: set[str] = set()
    seen_parts: set[str] = set()
    problems: list[str] = []
    for i, s in enumerate(splits):
        where = f"splits[{i}] ({s.table!r})"
        fp = fps.get(s.table)
        if fp is None:
            problems.append(f"{where}: {s.table!r} is not a table of the model")
            continue
        if s.table in seen_tables:
            problems.append(f"{where}: table {s.table!r} is split more than once")
        seen_tables.add(s.table)
        if fp.sequence:
            problems.append(
                f"{where}: {s.table!r} is an EmbeddingCollection's table; only pooled "
                "(EmbeddingBagCollection) tables are split"
            )
            continue
        problems += [f"{where}: {p}" for p in _part_problems(s, fps, seen_parts)]
        problems += [f"{where}: {p}" for p in _shape_problems(s, fp)]
        problems += [
            f"{where}: virtual feature {v!r} is also a feature of the model"
            for part in s.parts
            for v in (virtual_feature(f, part) for f in fp.feature_names)
            if v in model_features
        ]
    return problems


def _part_problems(s: Split, fps: dict[str, TableFingerprint], seen: set[str]) -> list[str]:
    problems = []
    if s.kind == "hot_cold" and len(s.parts) != 2:
        problems.append(f"hot_cold needs 2 parts (hot, cold), got {len(s.parts)}")
    if s.kind != "hot_cold" and len(s.parts) < 2:
        problems.append(f"{s.kind} needs at least 2 parts, got {len(s.parts)}")
    for p in s.parts:
        if p in fps:
            problems.append(f"part {p!r} is also a table of the model")
        elif p in seen:
            problems.append(f"part {p!r} is named more than once")
        if "." in p:
            problems.append(f"part {p!r} contains '.', which TorchRec table names cannot")
        seen.add(p)
    return problems


def _shape_problems(s: Split, fp: TableFingerprint) -> list[str]:
    rows, dim = fp.num_embeddings, fp.embedding_dim
    if s.kind == "hot_cold":
        if not s.hot_ids:
            return []  # the schema asks for at least one; a missing member is reported apart
        out = [_listed("hot ids", [x for x in s.hot_ids if x >= rows], f"beyond its {rows} rows")]
        dup = _duplicates(s.hot_ids)
        out.append(_listed("hot ids", dup, "named more than once"))
        if len(set(s.hot_ids)) >= rows:
            out.append(f"all {rows} rows are hot: the cold part would hold none")
        return [p for p in out if p]
    if not s.ranges:
        return []
    axis, total = ("rows", rows) if s.kind == "row_ranges" else ("columns", dim)
    what = "row range" if s.kind == "row_ranges" else "column slice"
    problems = []
    if len(s.ranges) != len(s.parts):
        problems.append(f"{len(s.parts)} parts but {len(s.ranges)} {what}s")
    at = 0
    for i, (a, b) in enumerate(s.ranges):
        if b <= a:
            problems.append(f"{what} {i} ({a}..{b}) is empty")
            return problems
        if a != at:
            gap = "overlaps the previous one" if a < at else f"leaves {axis} {at}..{a} uncovered"
            problems.append(f"{what}s must cover {axis} 0..{total} in order: {what} {i} {gap}")
            return problems
        at = b
    if at != total:
        problems.append(f"{what}s cover {axis} 0..{at} but the table has {total} {axis}")
    return problems


def _duplicates(ids: Iterable[int]) -> list[int]:
    seen: set[int] = set()
    dup: list[int] = []
    for x in ids:
        if x in seen:
            dup.append(x)
        seen.add(x)
    return dup


def _listed(what: str, ids: list[int], why: str) -> str:
    """ "hot ids 7, 9 are …" / "hot ids 7, 9, 12 … (5 in all) are …"; "" for none."""
    if not ids:
        return ""
    shown = ", ".join(str(x) for x in ids[:SHOWN])
    more = f" … ({len(ids)} in all)" if len(ids) > SHOWN else ""
    return f"{what} {shown}{more} {'is' if len(ids) == 1 else 'are'} {why}"


def split_fit_problems(s: Split, planned: TableFingerprint, actual: TableFingerprint) -> list[str]:
    """How the model's table `actual` breaks split `s` made for `planned`; [] if it fits.

    Each message names the table and, for sizes, the part and the range or ids out of reach.
    """
    t = s.table
    problems = []
    if planned.feature_names != actual.feature_names:
        problems.append(
            f"table {t!r} is split ({s.kind} into {', '.join(s.parts)}) by its features "
            f"{list(planned.feature_names)}, but the model feeds it {list(actual.feature_names)}"
        )
    rows, dim = actual.num_embeddings, actual.embedding_dim
    if planned.num_embeddings != rows:
        head = f"table {t!r} has {rows} rows in the model, {planned.num_embeddings} in the plan"
        problems.append(head + _rows_detail(s, rows))
    if planned.embedding_dim != dim:
        head = f"table {t!r} has dim {dim} in the model, {planned.embedding_dim} in the plan"
        detail = ""
        if s.kind == "column_slices":
            beyond = [(i, r) for i, r in enumerate(s.ranges) if r[1] > dim]
            if beyond:
                i, (a, b) = beyond[0]
                detail = (
                    f": its column slice {a}..{b} (part {s.parts[i]!r}) lies beyond the "
                    f"model's {dim} columns"
                )
        problems.append(head + detail)
    return problems


def _rows_detail(s: Split, rows: int) -> str:
    """What of split `s` lies beyond a model table of `rows` rows, as a message tail."""
    if s.kind == "row_ranges":
        beyond = [(i, r) for i, r in enumerate(s.ranges) if r[1] > rows]
        if beyond:
            i, (a, b) = beyond[0]
            return f": its row range {a}..{b} (part {s.parts[i]!r}) lies beyond the model's rows"
        return f": its row ranges cover rows 0..{s.ranges[-1][1]}, not the model's 0..{rows}"
    if s.kind == "hot_cold":
        hot = [x for x in s.hot_ids if x >= rows]
        if hot:
            return (
                f": its hot ids {min(hot)}..{max(hot)} (part {s.parts[0]!r}) lie beyond "
                f"the model's rows"
            )
    return ""
