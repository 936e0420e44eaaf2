"""Plain-text views of plans for people: per table, per rank, and the difference of two plans."""

from __future__ import annotations

import dataclasses
from typing import Any

from sparselift.plans.plan import Plan
from sparselift.plans.types import WEIGHT_BYTES, Split, TableFingerprint, TablePlan

# Sharding types as the per-table view abbreviates them.
DP = "data_parallel"
SHORT = {
    "data_parallel": "DP",
    "table_wise": "TW",
    "row_wise": "RW",
    "column_wise": "CW",
    "table_row_wise": "TWRW",
    "table_column_wise": "TWCW",
}


def _bytes(n: float) -> str:
    """`n` bytes for people: B, KiB, MiB, GiB or TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"


def _shards(t: TablePlan) -> str:
    """Where a table's shards are, in one phrase ("rank 1", "r0:rows 0-500, r1:rows 500-1000")."""
    if t.sharding_type == "data_parallel":
        return "whole table on every rank"
    if t.sharding_type == "table_wise":
        return f"rank {t.shards[0].rank}"
    axis = 0 if t.sharding_type in ("row_wise", "table_row_wise") else 1
    word = "rows" if axis == 0 else "cols"
    return ", ".join(
        f"r{s.rank}:{word} {s.offsets[axis]}-{s.offsets[axis] + s.sizes[axis]}" for s in t.shards
    )


def rank_elements(plan: Plan) -> list[dict[str, Any]]:
    """Per rank: tables touched, embedding elements held (rows × cols summed over its shards)
    and the bytes they take (each table's `data_type`).

    Returns:
        One {"tables": int, "elements": int, "bytes": float} per rank, in rank order.
    """
    fps = {t.name: t for t in plan.sharded_tables()}
    out: list[dict[str, Any]] = [
        {"tables": 0, "elements": 0, "bytes": 0.0} for _ in range(plan.topology.world_size)
    ]
    for t in plan.tables:
        fp = fps[t.name]
        size = WEIGHT_BYTES.get(fp.data_type, 4.0)
        if t.sharding_type == "data_parallel":
            held = [(r, fp.num_embeddings * fp.embedding_dim) for r in range(len(out))]
        else:
            held = [(s.rank, s.sizes[0] * s.sizes[1]) for s in t.shards]
        for r in sorted({r for r, _ in held}):
            out[r]["tables"] += 1
        for r, n in held:
            out[r]["elements"] += n
            out[r]["bytes"] += n * size
    return out


def _tables_note(plan: Plan) -> str:
    """ ", 1 in an EmbeddingCollection: history, 2 of fp16 weights: user, item": the plan's
    sequence tables (", 3 in 2 EmbeddingCollections: …" where the plan names several of their
    collections) and its tables of each weight type but fp32, if any."""
    sequence = [t for t in plan.model if t.sequence]
    n_ec = len({t.module for t in sequence if t.module is not None})
    where = "in an EmbeddingCollection" if n_ec <= 1 else f"in {n_ec} EmbeddingCollections"
    groups = [(where, [t.name for t in sequence])]
    for dt in sorted({t.data_type for t in plan.model} - {"fp32"}):
        groups.append((f"of {dt} weights", [t.name for t in plan.model if t.data_type == dt]))
    return "".join(
        f", {len(names)} {what}: " + ", ".join(names[:5]) + (", …" if len(names) > 5 else "")
        for what, names in groups
        if names
    )


def show(plan: Plan) -> str:
    """The plan for people: its topology and choices, then a per-table and a per-rank view."""
    topo = plan.topology
    lines = [
        f"plan {plan.source}",
        f"  topology    {topo.world_size} ranks ({topo.local_world_size} per host), {topo.device}"
        + (f", preset {topo.preset}" if topo.preset else ""),
        f"  pipeline    {plan.pipeline}",
        f"  comm        forward {plan.comm_precision.forward}, "
        f"backward {plan.comm_precision.backward}",
        f"  model       {len(plan.model)} tables"
        + (f" in {plan.module}" if plan.module else "")
        + _tables_note(plan),
        f"  collectives {collectives_line(plan)}",
    ]
    if plan.solver:
        facts = ", ".join(
            f"{k} {plan.solver[k]}"
            for k in ("status", "objective", "bound", "gap", "time_s", "seed")
            if plan.solver.get(k) is not None
        )
        lines.append(
            f"  solver      {plan.solver.get('name', '?')}" + (f" ({facts})" if facts else "")
        )
    fps = {t.name: t for t in plan.sharded_tables()}
    name_w = max(5, *(len(t.name) for t in plan.tables))
    lines += [
        "",
        "per table",
        f"  {'table':{name_w}s} {'rows':>11s} {'dim':>5s}  {'type':4s}  {'kernel':17s} shards",
    ]
    for t in sorted(plan.tables, key=lambda t: list(fps).index(t.name)):
        fp = fps[t.name]
        kernel = t.compute_kernel + (
            f" lf={t.cache_load_factor:g}" if t.cache_load_factor is not None else ""
        )
        lines.append(
            f"  {t.name:{name_w}s} {fp.num_embeddings:11,d} {fp.embedding_dim:5d}  "
            f"{SHORT[t.sharding_type]:4s}  {kernel:17s} {_shards(t)}"
        )
    lines += split_lines(plan)
    per_rank = rank_elements(plan)
    predicted = {p.get("rank"): p for p in (plan.predicted or {}).get("per_rank", []) or []}
    total = sum(r["elements"] for r in per_rank) or 1
    lines += [
        "",
        "per rank",
        f"  {'rank':>4s} {'tables':>6s} {'elements':>14s} {'weights':>13s} {'share':>6s}"
        + ("   predicted compute / comm / memory" if predicted else ""),
    ]
    for r, v in enumerate(per_rank):
        line = (
            f"  {r:4d} {v['tables']:6d} {v['elements']:14,d} {_bytes(v['bytes']):>13s} "
            f"{100 * v['elements'] / total:5.1f}%"
        )
        p = predicted.get(r)
        if p:
            line += "   " + " / ".join(
                "-"
                if p.get(k) is None
                else (_bytes(p[k]) if k == "memory_bytes" else f"{p[k] * 1e3:.2f} ms")
                for k in ("compute_s", "comm_s", "memory_bytes")
            )
        lines.append(line)
    step = (plan.predicted or {}).get("step_time_s")
    if step is not None:
        spread = (plan.predicted or {}).get("spread_s")
        late = (
            f" (of which {spread * 1e3:.2f} ms the slowest rank's expected lateness)"
            if isinstance(spread, (int, float)) and spread > 0
            else ""
        )
        lines.append(f"  predicted step time {step * 1e3:.2f} ms{late}")
    lines += statistics_lines(plan)
    lines += evidence_lines(plan)
    return "\n".join(lines)


STATISTICS_SHOWN = 10  # tables `show` lists of a plan's statistics digest; the file has them all


def collective_types(plan: Plan, with_splits: bool = True) -> list[str]:
    """The model-parallel sharding types of the plan's tables, in plan order, one per collective
    pair: TorchRec runs one input all-to-all and one output all-to-all (forward, and its gradient
    backward) per type in each collection (each labelled "<collection> <type>" where the plan
    records its tables in more than one collection; a table it records none for: "<type>").

    Args:
        plan: the plan.
        with_splits: False: of the tables no split made only (its splits' parts left out), so
            that the difference from the full list is the pairs the splits add.
    """
    parts = set() if with_splits else {name for s in plan.splits for name in s.parts}
    module = {t.name: t.module for t in plan.sharded_tables()}
    pairs = dict.fromkeys(
        (module.get(t.name), t.sharding_type)
        for t in plan.tables
        if t.sharding_type != DP and t.name not in parts
    )
    several = len({m for m, _ in pairs}) > 1
    return [f"{m} {st}" if several and m is not None else st for m, st in pairs]


def collectives_line(plan: Plan) -> str:
    """ "N all-to-all pairs per step (types …)", and the data-parallel tables' all-reduce."""
    types = collective_types(plan)
    dp = any(t.sharding_type == DP for t in plan.tables)
    return (
        f"{len(types)} all-to-all pair{'s' if len(types) != 1 else ''} per step"
        + (f" ({', '.join(types)})" if types else "")
        + ("; data-parallel tables' gradients all-reduced with the dense ones" if dp else "")
    )


def hot_share(plan: Plan, table: str) -> float | None:
    """The share of `table`'s lookups its hot part serves, as the plan's prediction recorded it
    (`predicted["splits"]`, written by `optimize`); None if not recorded."""
    share = (((plan.predicted or {}).get("splits") or {}).get(table) or {}).get("hot_share")
    return float(share) if isinstance(share, (int, float)) and not isinstance(share, bool) else None


def split_lines(plan: Plan) -> list[str]:
    """The plan's splits for people, one line each ([] without splits); a hot/cold split's
    share of lookups where the plan's prediction records it."""
    if not plan.splits:
        return []
    lines = ["", "splits (virtual tables)"]
    for s in plan.splits:
        if s.kind == "hot_cold":
            share = hot_share(plan, s.table)
            rows = f"{len(s.hot_ids):,} hot rows" + (
                f" ({share:.0%} of lookups)" if share is not None else ""
            )
            what = f"{rows} in {s.parts[0]}, the rest in {s.parts[1]}"
        else:
            word = "rows" if s.kind == "row_ranges" else "cols"
            what = ", ".join(
                f"{p} {word} {a}-{b}" for p, (a, b) in zip(s.parts, s.ranges, strict=False)
            )
        lines.append(f"  {s.table}: {s.kind}: {what}")
    return lines


def statistics_lines(plan: Plan, limit: int = STATISTICS_SHOWN) -> list[str]:
    """The plan's statistics digest for people: the first `limit` tables in model order, one
    line each, and how many more the file holds; [] for a plan without a digest."""
    if plan.statistics is None:
        return []
    names = [t.name for t in plan.model if t.name in plan.statistics]
    width = max(5, *(len(n) for n in names)) if names else 5
    lines = [
        "",
        f"statistics digest ({len(names)} tables; what `sparselift plan check` compares with)",
        f"  {'table':{width}s} {'ids/step/rank':>14s} {'unique':>7s} {'pooling':>8s} "
        f"{'hot 1%':>7s}",
    ]
    for name in names[:limit]:
        v = plan.statistics[name]
        lines.append(
            f"  {name:{width}s} {v['ids_per_step']:14,.0f} {v['unique_ratio']:7.3f} "
            f"{v['pooling']:8.3g} {v['hot_share']:7.3f}"
        )
    if len(names) > limit:
        lines.append(f"  … and {len(names) - limit} more tables (all in the plan file)")
    return lines


def evidence_lines(plan: Plan) -> list[str]:
    """The plan's `evidence` for people: one line per coefficient, measured ones first, then
    assumed, each group by name (the order the file keeps); [] for a plan without evidence."""
    if not plan.evidence:
        return []
    items = sorted(plan.evidence.items())
    width = max(len(name) for name, _ in items)
    ordered = [it for it in items if it[1].get("source") == "measured"] + [
        it for it in items if it[1].get("source") != "measured"
    ]
    n_measured = sum(1 for _, e in items if e.get("source") == "measured")
    lines = ["", f"evidence ({n_measured} of {len(items)} coefficients measured)"]
    for name, e in ordered:
        lines.append(f"  {name:{width}s}  {e.get('source', '?'):8s}  from {e.get('from', '?')}")
    return lines


def diff(a: Plan, b: Plan) -> list[str]:
    """One line per difference between plan `a` and plan `b`; [] if they shard identically."""
    out = []
    for what, value_a, value_b in (
        ("topology", a.topology, b.topology),
        ("comm_precision", a.comm_precision, b.comm_precision),
    ):  # field by field: a dataclass's repr is not a line to read
        out += [
            f"{what}: {f.name} {getattr(value_a, f.name)} -> {getattr(value_b, f.name)}"
            for f in dataclasses.fields(value_a)
            if getattr(value_a, f.name) != getattr(value_b, f.name)
        ]
    if a.pipeline != b.pipeline:
        out.append(f"pipeline: {a.pipeline} -> {b.pipeline}")
    model_a, model_b = _named_modules(a), _named_modules(b)
    for name in model_a:
        if name not in model_b:
            out.append(f"model: table {name!r} only in A")
        elif model_a[name] != model_b[name]:
            ta, tb = model_a[name], model_b[name]
            out += [
                f"model: table {name!r}: {f.name} {getattr(ta, f.name)!r} -> "
                f"{getattr(tb, f.name)!r}"
                for f in dataclasses.fields(ta)
                if getattr(ta, f.name) != getattr(tb, f.name)
                and (f.name != "module" or None not in (ta.module, tb.module))
            ]
    out += [f"model: table {name!r} only in B" for name in model_b if name not in model_a]
    out += _split_diff(a, b)
    tables_a, tables_b = {t.name: t for t in a.tables}, {t.name: t for t in b.tables}
    if a.splits or b.splits:  # virtual tables come and go with splits
        out += [f"table {n}: only in A" for n in tables_a if n not in tables_b]
        out += [f"table {n}: only in B" for n in tables_b if n not in tables_a]
    for x in a.tables:
        y = tables_b.get(x.name)
        if y is None:
            continue
        changes = []
        if x.sharding_type != y.sharding_type:
            changes.append(f"{x.sharding_type} -> {y.sharding_type}")
        if x.compute_kernel != y.compute_kernel:
            changes.append(f"kernel {x.compute_kernel} -> {y.compute_kernel}")
        if x.cache_load_factor != y.cache_load_factor:
            changes.append(f"cache_load_factor {x.cache_load_factor} -> {y.cache_load_factor}")
        if x.shards != y.shards or x.ranks != y.ranks:
            changes.append(f"{_shards(x)} -> {_shards(y)}")
        if changes:
            out.append(f"table {x.name}: " + "; ".join(changes))
    return out


def _named_modules(plan: Plan) -> dict[str, TableFingerprint]:
    """`plan`'s model tables by name, each with its collection where the table or the plan names
    one (a table's `module`, else the plan's). A plan that names none says nothing about it, so
    `diff` does not count that as a difference: table names are unique across collections."""
    return {
        t.name: t if t.module is not None else dataclasses.replace(t, module=plan.module)
        for t in plan.model
    }


def _split_diff(a: Plan, b: Plan) -> list[str]:
    """One line per model table split differently (or only) in `a` or `b`."""
    sa, sb = {s.table: s for s in a.splits}, {s.table: s for s in b.splits}
    out: list[str] = []
    for table in [t.name for t in a.model] + [t.name for t in b.model if t.name not in sa]:
        x, y = sa.get(table), sb.get(table)
        if (
            x != y
            and (x is not None or y is not None)
            and not any(line.startswith(f"split {table}:") for line in out)
        ):
            out.append(f"split {table}: {_split_phrase(x)} -> {_split_phrase(y)}")
    return out


def _split_phrase(s: object) -> str:
    if s is None:
        return "not split"
    assert isinstance(s, Split)
    if s.kind == "hot_cold":
        return f"hot_cold ({len(s.hot_ids):,} hot rows)"
    return f"{s.kind} {[list(r) for r in s.ranges]}"
