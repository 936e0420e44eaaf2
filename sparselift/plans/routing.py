"""The routing of split features' ids to their parts, for `transform.BatchTransform`.

The split features are routed in at most four groups (row ranges in 2 parts, of any table, by
comparison with their boundary; other hot/cold and row-range splits of tables up to
`LOOKUP_TABLE_MAX_ROWS` rows by lookup table; beyond: hot/cold by binary search, row ranges in
more parts by their range starts; column slices are only checked), each with a fixed number of
vectorized ops over all of its ids, so that the cost of a batch does not grow with the number of
split features. Every id becomes a code, n_parts × its row in its part + its part. Two parts are
split by `partition` (a cumulative sum and a scatter); more by one FBGEMM bucketize of the codes
(`bucketed`), which keeps each bag's order and counts each bag's ids per part. A lookup-table
group gathers each feature's codes from its own table's rows of one table of every row
(`looked_up`): one small op a feature, which also checks the range, and 32-bit codes, which
bucketize divides several times faster than 64-bit ones. The other groups check the range
(`any_outside`); a two-part row-range group then compares each feature's ids with its boundary
(one streaming pass, cheaper than a gather at random), the others compute the codes
(`id_codes`) from per-id parameters.
"""

from __future__ import annotations

import dataclasses

import torch

from sparselift.plans.types import Split, TableFingerprint

# Up to this many rows a hot/cold split, or a row-range split in more than 2 parts, looks ids up
# in a table of every row (int32 codes, 4 bytes a row: the table is gathered at random, so its
# size is what the lookup costs; one per table, not per feature); beyond, a hot/cold split
# searches the sorted hot ids (a binary search per id) and a row-range split its range starts.
LOOKUP_TABLE_MAX_ROWS = 1 << 21

INT32_CODES = (1 << 31) - 1  # the largest code of a lookup table kept in 32 bits

LOOKUP, HOT_SEARCH, RANGES_2, RANGES_N, COLUMNS = (
    "lookup", "hot_search", "ranges_2", "ranges_n", "columns"
)  # fmt: skip
ROUTED = (LOOKUP, HOT_SEARCH, RANGES_2, RANGES_N)  # the groups with streams of their own


@dataclasses.dataclass
class Group:
    """The split features of one input key order that are routed alike, in input order.

    `params[k]` is what feature k's ids need: its table's offset in the group's lookup space, or
    (RANGES_2) its table's boundary row. Part p of feature k is member p * len(features) + k of
    stream `stream` (`Stream`).
    """

    kind: str
    features: list[int]  # input indices
    runs: list[tuple[int, int]]  # the features as runs [a, b) of consecutive input indices
    params: list[int]
    rows1: list[int]  # per feature: its table's rows - 1
    n_parts: int
    stream: int = 0


@dataclasses.dataclass
class Tables:
    """Every split table's routing data in one tensor per group kind, on one device."""

    lut: torch.Tensor  # LOOKUP: each row of each table (at its offset) as its code
    hot_keys: torch.Tensor  # HOT_SEARCH: offset + hot id of every hot id, sorted
    hot_rows: torch.Tensor  # … and the hot row of each
    starts: torch.Tensor  # RANGES_N: offset + first row of every range, sorted
    part_of: torch.Tensor  # … and the part that range is


@dataclasses.dataclass
class Stream:
    """Ids with their per-bag counts, feature after feature (`prefix`: each feature's start)."""

    values: torch.Tensor
    weights: torch.Tensor | None
    counts: torch.Tensor
    prefix: list[int]


# --------------------------------------------------------------------------- the routing


def per_id(per_feature: list[int], sizes: list[int], ids: torch.Tensor) -> torch.Tensor:
    """Each id's entry of `per_feature` (its feature's), for features of `sizes` ids in order.

    A cumulative sum of the changes at the features' first ids: two small copies and one pass.
    """
    at, last = 0, 0
    starts, steps = [], []
    for v, n in zip(per_feature, sizes, strict=True):
        if n:
            starts.append(at)
            steps.append(v - last)
            last = v
        at += n
    out = torch.zeros(ids.numel(), dtype=torch.int64, device=ids.device)
    index = torch.tensor(starts, dtype=torch.int64, device=ids.device)
    out[index] = torch.tensor(steps, dtype=torch.int64, device=ids.device)
    return out.cumsum_(0)


def any_outside(ids: torch.Tensor, sizes: list[int], rows1: list[int]) -> bool:
    """Whether any id lies outside 0..rows-1 of its table, for features of `sizes` ids in order
    whose tables have `rows1` (rows - 1) each.

    One pass for the least and the largest id of all; only where the largest is past the
    smallest table, one maximum per feature (a single foreach op over views). No per-id tensor
    is built.
    """
    if not ids.numel():
        return False
    least, largest = (int(x) for x in torch.aminmax(ids))
    if least < 0:
        return True
    if largest <= min(rows1):
        return False
    maxima = torch.stack(torch._foreach_max([p for p in ids.split(sizes) if p.numel()]))
    limits = [r for n, r in zip(sizes, rows1, strict=True) if n]
    return bool((maxima > torch.tensor(limits, device=ids.device)).any())


def looked_up(g: Group, lut: torch.Tensor, feature_ids: list[torch.Tensor]) -> torch.Tensor | None:
    """LOOKUP: each id's code (`id_codes`), the ids of each of `g.features` looked up in its
    own table's rows of `lut`; None when an id lies outside its table.

    One gather a feature straight into the output: on the CPU the gather checks each index
    against the table's rows (IndexError), so no range check, per-id offset or concatenation is
    needed. (A CUDA gather asserts instead: the caller checks the range first there.)
    """
    codes = torch.empty(sum(x.numel() for x in feature_ids), dtype=lut.dtype, device=lut.device)
    at = 0
    try:
        for offset, rows1, ids in zip(g.params, g.rows1, feature_ids, strict=True):
            n = ids.numel()
            torch.index_select(lut[offset : offset + rows1 + 1], 0, ids, out=codes[at : at + n])
            at += n
    except IndexError:
        return None
    return codes


def id_codes(g: Group, tables: Tables, ids: torch.Tensor, per_id: torch.Tensor) -> torch.Tensor:
    """Each id as n_parts * (its row in its part) + its part (`per_id`: its `Group.params`
    entry, reused), for HOT_SEARCH and RANGES_N (LOOKUP: `looked_up`; RANGES_2 compares each
    feature's ids with its boundary instead)."""
    key = per_id.add_(ids)  # the id in the group's lookup space
    if g.kind == HOT_SEARCH:
        cold = ids.long() * 2 + 1
        n = tables.hot_keys.numel()
        if n == 0:
            return cold
        pos = torch.searchsorted(tables.hot_keys, key).clamp_(max=n - 1)
        hot = tables.hot_keys[pos] == key
        return torch.where(hot, tables.hot_rows[pos] * 2, cold)
    r = torch.searchsorted(tables.starts, key, right=True).sub_(1)
    return key.sub_(tables.starts[r]).mul_(g.n_parts).add_(tables.part_of[r])


def bucketed(
    codes: torch.Tensor,
    n_parts: int,
    lens: torch.Tensor,
    wts: torch.Tensor | None,
    n_features: int,
    stride: int,
) -> Stream:
    """The ids of `codes` part by part, each part feature by feature, bags in order: FBGEMM's
    bucketize (bucket = code % n_parts, id = code // n_parts) keeps each bag's order. The ids
    keep the codes' dtype (the output's concatenation converts them)."""
    bucketize = torch.ops.fbgemm.bucketize_sparse_features
    lens_c = lens.to(codes.dtype)
    w32 = wts if wts is not None and wts.dtype == torch.float32 else None  # what FBGEMM takes
    new_lens, new_ids, new_wts, _ = bucketize(lens_c, codes, False, n_parts, w32)
    if wts is not None and w32 is None:  # other weights: by the positions, bucketized alike
        at = torch.arange(codes.numel(), dtype=codes.dtype, device=codes.device)
        new_wts = wts[bucketize(lens_c, at.mul_(n_parts).add_(codes % n_parts), False, n_parts)[1]]
    starts = member_starts(new_lens, n_parts * n_features, stride)
    return Stream(new_ids, new_wts, new_lens.to(lens.dtype), starts)


def member_starts(counts: torch.Tensor, n_members: int, stride: int) -> list[int]:
    """Each member's first index in a stream of per-bag `counts` (`stride` bags a member, member
    after member), then the stream's length."""
    prefix = [0]
    for n in counts.view(n_members, stride).sum(1).tolist():
        prefix.append(prefix[-1] + n)
    return prefix


def slices(x: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """`x[a:b]` for each of `bounds`, one after the other (a view for one slice)."""
    parts = [x[a:b] for a, b in bounds]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def merge_blocks(blocks: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(stream, member) blocks as (stream, first, end): consecutive members in one slice."""
    out: list[tuple[int, int, int]] = []
    for s, k in blocks:
        if out and out[-1][0] == s and out[-1][2] == k:
            out[-1] = (s, out[-1][1], k + 1)
        else:
            out.append((s, k, k + 1))
    return out


# ------------------------------------------------------------------------ routing tables


@dataclasses.dataclass
class Layout:
    """Where each split table is routed: per table, its group kind, its per-id parameter (its
    offset in its group's lookup space, or for RANGES_2 its boundary row) and that offset
    (tables one after the other, in model order); per group kind, its number of parts (the most
    of any of its tables: the codes' multiplier)."""

    kind: dict[str, str]
    param: dict[str, int]
    offset: dict[str, int]
    n_parts: dict[str, int]


def layout(model: list[TableFingerprint], splits: dict[str, Split]) -> Layout:
    """The `Layout` of `splits` of `model`'s tables."""
    out = Layout({}, {}, {}, {})
    space: dict[str, int] = {}
    for t in model:
        s = splits.get(t.name)
        if s is None:
            continue
        if s.kind == "column_slices":
            k = COLUMNS
        elif s.kind == "row_ranges" and len(s.parts) == 2:
            k = RANGES_2
        elif t.num_embeddings <= LOOKUP_TABLE_MAX_ROWS:
            k = LOOKUP
        elif s.kind == "hot_cold":
            k = HOT_SEARCH
        else:
            k = RANGES_N
        out.kind[t.name] = k
        out.offset[t.name] = space.get(k, 0)
        space[k] = out.offset[t.name] + t.num_embeddings
        out.param[t.name] = s.ranges[1][0] if k == RANGES_2 else out.offset[t.name]
        out.n_parts[k] = max(out.n_parts.get(k, 0), len(s.parts))
    return out


def build_tables(model: list[TableFingerprint], splits: dict[str, Split], lay: Layout) -> Tables:
    """The lookup table, sorted hot ids and range starts of every split table (see `Tables`),
    on the CPU: the lookup table int32 where its codes fit (int64 otherwise), the rest int64."""
    n = lay.n_parts.get(LOOKUP, 1)
    lut_rows = [t.num_embeddings for t in model if lay.kind.get(t.name) == LOOKUP]
    lut = torch.empty(sum(lut_rows), dtype=torch.int64)
    keys, rows, starts, part_of = [], [], [], []
    for t in model:
        k, s = lay.kind.get(t.name), splits.get(t.name)
        if s is None:
            continue
        at = lay.offset[t.name]
        if k == LOOKUP:
            lut[at : at + t.num_embeddings] = lookup_codes(t.num_embeddings, s, n)
        elif k == HOT_SEARCH:
            hot = torch.tensor(s.hot_ids, dtype=torch.int64)
            by_id = torch.argsort(hot)
            keys.append(hot[by_id] + at)
            rows.append(by_id)
        elif k == RANGES_N:
            starts += [at + a for a, _ in s.ranges]
            part_of += list(range(len(s.ranges)))

    none = torch.zeros(0, dtype=torch.int64)
    if n * max(lut_rows, default=0) <= INT32_CODES:
        lut = lut.to(torch.int32)
    return Tables(
        lut=lut,
        hot_keys=torch.cat(keys) if keys else none,
        hot_rows=torch.cat(rows) if rows else none,
        starts=torch.tensor(starts, dtype=torch.int64),
        part_of=torch.tensor(part_of, dtype=torch.int64),
    )


def lookup_codes(rows: int, s: Split, n_parts: int) -> torch.Tensor:
    """Each of a table's `rows` rows as its code under split `s`, with `n_parts` parts a code:
    hot/cold: a hot id at hot row r is n_parts * r (part 0), any other id n_parts * id + 1;
    row ranges: a row in range i is n_parts * (row - range i's start) + i."""
    if s.kind == "hot_cold":
        codes = torch.arange(rows, dtype=torch.int64) * n_parts + 1  # cold
        hot = torch.tensor(s.hot_ids, dtype=torch.int64)
        codes[hot] = torch.arange(len(hot), dtype=torch.int64) * n_parts
        return codes
    codes = torch.empty(rows, dtype=torch.int64)
    for i, (a, b) in enumerate(s.ranges):
        torch.arange(b - a, dtype=torch.int64, out=codes[a:b]).mul_(n_parts).add_(i)
    return codes
