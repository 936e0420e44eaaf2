"""Read a profile directory's manifest.json once, with its shape checked, for every stage.

The analysis, `compare`, `plan check` and the optimizer all read the manifest; a hand-edited or
damaged one (a list where the profiler writes an object, a string where it writes an integer)
must be refused as bad input in one line naming the key, not fail deep inside a stage. The checks
are about types and ranges only, and only of keys present and not null (older manifests lack
some; unknown values are null, `sparselift.profiler.manifest`); what a value means is left to
the stage that uses it. Imports only the standard library and our own JSON reader, so the
optimizer can use it without the analysis (pandas, traces) or the profiler (torch).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.jsonfile import read_versioned

# as sparselift.profiler.manifest writes it (not imported: the profiler package pulls in torch)
FORMAT, VERSION = "sparselift-profile", 1
MANIFEST = "manifest.json"


def _int(v: Any, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _list_of(test: Any) -> Any:
    return lambda v: isinstance(v, list) and all(test(x) for x in v)


def _object(v: Any) -> bool:
    return isinstance(v, dict)


def _table(t: Any) -> bool:
    """A table as the profiler records it: only its name is required."""
    return (
        _object(t)
        and isinstance(t.get("name"), str)
        and all(t.get(k) is None or _int(t[k], 1) for k in ("num_embeddings", "embedding_dim"))
        and (
            t.get("feature_names") is None
            or _list_of(lambda f: isinstance(f, str))(t["feature_names"])
        )
        and all(
            t.get(k) is None or isinstance(t[k], str)
            for k in ("module", "data_type", "pooling_type")
        )
    )


TABLES = (
    "a list of objects, each with a string 'name' (and, where present, integers "
    "'num_embeddings' and 'embedding_dim' >= 1, 'feature_names' a list of strings, strings "
    "'module', 'data_type' and 'pooling_type')",
    _list_of(_table),
)


def _pair(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_int(x, 0) for x in v)


def _shard(v: Any) -> bool:
    return (
        _object(v) and _int(v.get("rank"), 0) and _pair(v.get("offsets")) and _pair(v.get("sizes"))
    )


def _sharding_entry(e: Any) -> bool:
    """A table's sharding as the profiler records it (a plan's table entry, `PlanTable`)."""
    return (
        _object(e)
        and isinstance(e.get("table"), str)
        and all(
            e.get(k) is None or isinstance(e[k], str) for k in ("sharding_type", "compute_kernel")
        )
        and (e.get("ranks") is None or _list_of(lambda r: _int(r, 0))(e["ranks"]))
        and (e.get("shards") is None or _list_of(_shard)(e["shards"]))
    )


# top-level key → (what it must be, in words; the test of a present, non-null value)
SHAPES: dict[str, tuple[str, Any]] = {
    "local_world_size": ("an integer >= 1", lambda v: _int(v, 1)),
    "batch_size": ("an integer >= 1", lambda v: _int(v, 1)),
    "warmup": ("an integer >= 0", lambda v: _int(v, 0)),
    "workload": ("a string", lambda v: isinstance(v, str)),
    "device": ("a string", lambda v: isinstance(v, str)),
    "backend": ("a string", lambda v: isinstance(v, str)),
    "pipeline": ("a string", lambda v: isinstance(v, str)),
    "gpu": ("a string", lambda v: isinstance(v, str)),
    "profiled_steps": ("a list of integers >= 0", _list_of(lambda x: _int(x, 0))),
    "step_times_s": (
        "a list (per rank) of lists of finite numbers",
        _list_of(_list_of(_number)),
    ),
    "steady_step_s": ("a list of finite numbers", _list_of(_number)),
    "missing_ranks": ("a list of integers >= 0", _list_of(lambda x: _int(x, 0))),
    "hosts": ("a list of strings", _list_of(lambda x: isinstance(x, str))),
    "host_cores": ("a list of integers >= 1 or nulls", _list_of(lambda x: x is None or _int(x, 1))),
    "tables": TABLES,
    "model_tables": TABLES,
    "splits": ("a list of objects", _list_of(_object)),
    "sharding": (
        "a list of objects, each with a string 'table', 'ranks' (integers >= 0) and 'shards' "
        "(objects of an integer 'rank' and 'offsets' and 'sizes' of 2 integers >= 0)",
        _list_of(_sharding_entry),
    ),
    "files": ("an object", _object),
    "comm_precision": ("an object", _object),
    "batch_transform": ("an object", _object),
    "recombine": ("an object", _object),
    "lookup_s": (
        "a list (per rank) of objects of 'window' and 'steady' lists of [forward, backward]",
        _list_of(
            lambda r: (
                _object(r)
                and all(
                    _list_of(
                        lambda x: isinstance(x, list) and len(x) == 2 and all(map(_number, x))
                    )(r.get(k, []))
                    for k in ("window", "steady")
                )
            )
        ),
    ),
    "side_by_side_job": ("a non-empty string", lambda v: isinstance(v, str) and v != ""),
    "steady_turn_steps": ("an integer >= 1", lambda v: _int(v, 1)),
    "side_by_side_plans": (
        "a list of plan paths or nulls",
        _list_of(lambda x: x is None or isinstance(x, str)),
    ),
}
FILE_SHAPES: dict[str, tuple[str, Any]] = {
    "traces": ("a list of file names", _list_of(lambda x: isinstance(x, str))),
    "execution_traces": ("a list of file names", _list_of(lambda x: isinstance(x, str))),
    "access_stats": ("a file name", lambda v: isinstance(v, str) and v != ""),
    "hot_ids": ("a file name", lambda v: isinstance(v, str)),
}


def read_manifest(d: str | Path) -> dict[str, Any]:
    """`d`/manifest.json: a profile manifest of this version, its keys' shapes checked.

    Args:
        d: the profile directory.
    Returns:
        The manifest's object; `world_size` is a positive integer, and every key of SHAPES (and
        of `files`, FILE_SHAPES) is absent, null or of its shape; `missing_ranks` are ranks of
        the run.
    Raises:
        UserError: "<d>/manifest.json: …" — missing, malformed, another format or version, or
            the first key of the wrong shape (named, with what it must be and what it is).
    """
    p = Path(d) / MANIFEST
    if not p.is_file():
        raise UserError(f"{p}: missing (not a sparselift profile directory)")
    m = read_versioned(p, FORMAT, VERSION, "profile manifest")
    if not _int(m.get("world_size"), 1):
        raise UserError(f"{p}: 'world_size' missing or not a positive integer")
    _check(p, m, SHAPES, "")
    _check(p, m.get("files") or {}, FILE_SHAPES, "files.")
    for key, ranks in (
        ("missing_ranks", m.get("missing_ranks") or []),
        ("sharding", [r for e in m.get("sharding") or [] for r in _ranks_of(e)]),
    ):
        beyond = [r for r in ranks if r >= m["world_size"]]
        if beyond:
            raise UserError(
                f"{p}: '{key}' names rank {beyond[0]}, not a rank of world_size {m['world_size']}"
            )
    return m


def _ranks_of(e: dict[str, Any]) -> list[int]:
    return [*(e.get("ranks") or []), *(s["rank"] for s in e.get("shards") or [])]


def check_unique_tables(d: str | Path, m: dict[str, Any]) -> None:
    """Refuse to analyze or plan from a profile of a model whose collections share a table name
    (`read_manifest`'s manifest `m` of `d`): statistics and plans are kept per table name, so
    two tables would be read as one. (Its step times still compare.)

    Raises:
        UserError: naming the table and its collections.
    """
    p = Path(d) / MANIFEST
    modules: dict[str, list[str]] = {}
    for t in m.get("tables") or []:
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            modules.setdefault(t["name"], []).append(repr(t.get("module")))
    for name, where in modules.items():
        if len(where) > 1:
            raise UserError(
                f"{p}: table {name!r} is in {len(where)} collections of the model "
                f"({', '.join(where)}): SparseLift keeps statistics and plans per table name, "
                "so rename all but one and profile again"
            )


def shared_cores(dirs: list[str] | list[Path]) -> str | None:
    """A warning, in one line, where the ranks of CPU profiles `dirs` outnumbered their host's
    cores; None where each rank had a core of its own (or no manifest says).

    Why: ranks that share cores also wait for one another's cores, so a lighter rank's wait is
    not idle time, and evening out the ranks' loads buys less than where each has a core.
    `optimize` prices that with one factor fitted from the profiled plan
    (`optimizer.crowding`), an approximation of a host that the profiles measured crowded.

    Raises:
        UserError: a directory's manifest is missing or malformed (`read_manifest`).
    """
    crowded = [(d, c) for d in dirs if (c := crowded_host(read_manifest(d))) is not None]
    if not crowded:
        return None
    d, (host, ranks, cores) = crowded[0]
    more = f" (and in {len(crowded) - 1} more of the profiles)" if len(crowded) > 1 else ""
    return (
        f"warning: {d}: {ranks} ranks shared {cores} cores on host {host!r}{more}: they wait for "
        "cores as well as for one another, which the cost model prices with one factor fitted "
        "from the profiled plan (crowd_factor), so its predicted gains are rougher; measure a "
        "plan before trusting them (`sparselift bench`, `sparselift tune`)"
    )


def crowded_host(m: dict[str, Any]) -> tuple[str, int, int] | None:
    """The first host of a CPU profile (manifest `m`) with more ranks than cores: (host, ranks,
    cores); None where each rank had a core of its own, or the manifest does not say."""
    hosts, cores = m.get("hosts") or [], m.get("host_cores") or []
    if m.get("device") != "cpu" or len(hosts) != len(cores):
        return None
    ranks: dict[str, int] = {}
    least: dict[str, int] = {}
    for host, n in zip(hosts, cores, strict=True):
        ranks[host] = ranks.get(host, 0) + 1
        if n is not None:
            least[host] = min(n, least.get(host, n))
    return next(((h, ranks[h], least[h]) for h in least if ranks[h] > least[h]), None)


def _check(p: Path, obj: dict[str, Any], shapes: dict[str, tuple[str, Any]], at: str) -> None:
    for key, (what, test) in shapes.items():
        v = obj.get(key)
        if v is not None and not test(v):
            raise UserError(f"{p}: '{at}{key}' must be {what}, got {_short(v)}")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def is_sequence_table(table: Any) -> bool:
    """Whether a manifest's (or plan's) table entry is an EmbeddingCollection's: the profiler
    records its `pooling_type` as "NONE"; a plan file marks it `"sequence": true`."""
    return isinstance(table, dict) and (
        table.get("pooling_type") == "NONE" or table.get("sequence") is True
    )
