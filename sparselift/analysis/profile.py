"""The profile directory (manifest.json, rank<R>.trace.json.gz, access_stats.parquet), checked.

Every way a directory can be wrong — a rank's trace missing, a trace from another run or rank, a
file that is not a trace — is found here, before any output is written, and reported as one line
naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.trace import Trace, load_trace
from sparselift.errors import UserError
from sparselift.jsonfile import read_versioned

# as sparselift.profiler.manifest writes it (not imported: the profiler package pulls in torch)
PROFILE_FORMAT, PROFILE_VERSION = "sparselift-profile", 1


@dataclass
class Profile:
    """A profile directory, read and cross-checked.

    Attributes:
        path: the directory.
        manifest: manifest.json's object.
        traces: one per rank, index = rank.
        access_stats: access_stats.parquet (one row per table, rank and step), if present.
        plan_tables: the plan in force, one row per shard (`plan_tables`).
    """

    path: Path
    manifest: dict[str, Any]
    traces: list[Trace]
    access_stats: pd.DataFrame | None
    plan_tables: pd.DataFrame


class StepSpan(NamedTuple):
    """The profiled steps a trace holds and the time they span (trace microseconds)."""

    steps: list[int]
    start_us: float
    end_us: float


def read_manifest(d: Path) -> dict[str, Any]:
    """`d`/manifest.json, checked: a profile manifest of this version with a positive world_size.

    Raises:
        UserError: missing, not a profile manifest, or no valid world_size.
    """
    p = d / "manifest.json"
    if not p.is_file():
        raise UserError(f"{p}: missing (not a sparselift profile directory)")
    m = read_versioned(p, PROFILE_FORMAT, PROFILE_VERSION, "profile manifest")
    if not isinstance(m.get("world_size"), int) or m["world_size"] < 1:
        raise UserError(f"{p}: 'world_size' missing or not a positive integer")
    return m


def trace_path(d: Path, rank: int, manifest: dict[str, Any]) -> Path:
    """Rank `rank`'s trace in `d` (rank<R>.trace.json.gz, or uncompressed).

    Raises:
        UserError: no such file; names the file the manifest lists.
    """
    listed = (manifest.get("files") or {}).get("traces") or []
    for name in (f"rank{rank}.trace.json.gz", f"rank{rank}.trace.json"):
        if (d / name).is_file():
            return d / name
    want = listed[rank] if rank < len(listed) else f"rank{rank}.trace.json.gz"
    raise UserError(
        f"{d / want}: missing — rank {rank}'s trace "
        f"(manifest says world size {manifest['world_size']})"
    )


def plan_tables(manifest: dict[str, Any]) -> pd.DataFrame:
    """The manifest's plan as one row per shard: table, module, sharding_type, rank, rows, cols.

    Data-parallel tables get one row per rank, each the whole table.
    """
    dims = {
        t["name"]: t for t in manifest.get("tables") or [] if isinstance(t, dict) and "name" in t
    }
    world = manifest["world_size"]
    rows = []
    for e in manifest.get("sharding") or []:
        name = e.get("table") or e.get("name")
        t = dims.get(name, {})
        if e.get("sharding_type") == "data_parallel" or not e.get("shards"):
            for r in e.get("ranks") or range(world):
                rows.append(
                    (
                        name,
                        e.get("module"),
                        e.get("sharding_type"),
                        r,
                        t.get("num_embeddings", 0),
                        t.get("embedding_dim", 0),
                    )
                )
            continue
        for s in e["shards"]:
            rows.append(
                (
                    name,
                    e.get("module"),
                    e.get("sharding_type"),
                    s["rank"],
                    s["sizes"][0],
                    s["sizes"][1],
                )
            )
    return pd.DataFrame(rows, columns=["table", "module", "sharding_type", "rank", "rows", "cols"])


def load_profile(
    path: str | Path, cache: bool = True, progress: Callable[[str], None] | None = None
) -> Profile:
    """Read and cross-check a profile directory.

    Args:
        path: the profile directory.
        cache: read and write the parsed-trace cache beside the traces.
        progress: called with one line per trace before it is parsed, if given.
    Raises:
        UserError: names the first bad file (missing, corrupt, from another rank or run).
    """
    d = Path(path)
    if not d.is_dir():
        raise UserError(f"{d}: not a directory")
    m = read_manifest(d)
    world = m["world_size"]
    traces = []
    for r in range(world):
        p = trace_path(d, r, m)
        if progress is not None:
            size = p.stat().st_size / 2**20 if p.is_file() else 0.0
            progress(f"parsing trace {r + 1}/{world}: {p.name} ({size:.1f} MiB)")
        tr = load_trace(p, cache=cache)
        if tr.rank is not None and tr.rank != r:
            raise UserError(
                f"{p}: is rank {tr.rank}'s trace, expected rank {r} "
                f"(files from different runs mixed?)"
            )
        if tr.world_size is not None and tr.world_size != world:
            raise UserError(
                f"{p}: from a run with world size {tr.world_size}, manifest says {world} "
                f"(traces from different runs mixed)"
            )
        traces.append(tr)
    check_same_run(traces, m)
    stats = None
    sp = d / ((m.get("files") or {}).get("access_stats") or "access_stats.parquet")
    if sp.is_file():
        try:
            stats = pd.read_parquet(sp)
        except Exception as e:  # any unreadable parquet is bad input, whatever pyarrow raises
            raise UserError(f"{sp}: unreadable Parquet ({e.__class__.__name__})") from None
    return Profile(
        path=d, manifest=m, traces=traces, access_stats=stats, plan_tables=plan_tables(m)
    )


def step_span(tr: Trace) -> StepSpan:
    """The ProfilerStep#N steps of `tr` and the time they span.

    Raises:
        UserError: the trace has no ProfilerStep#N event.
    """
    s = tr.events[tr.events["name"].str.match(names.STEP.pattern)]
    if s.empty:
        raise UserError(
            f"{tr.path}: no ProfilerStep#N events (not a sparselift/torch.profiler step trace)"
        )
    steps = sorted(s["name"].str.extract(names.STEP.pattern)[0].astype(int).unique())
    return StepSpan(steps, float(s["ts"].min()), float(s["end"].max()))


def check_same_run(traces: list[Trace], manifest: dict[str, Any]) -> None:
    """Check that the traces come from one run: the manifest's steps, overlapping in time.

    Ranks of one run profile the same steps at the same time (they meet in collectives).

    Raises:
        UserError: a trace holds other steps, or its steps do not overlap the first rank's.
    """
    want = manifest.get("profiled_steps")
    spans = []
    for tr in traces:
        span = step_span(tr)
        if want and span.steps != sorted(want):
            raise UserError(
                f"{tr.path}: holds steps {span.steps}, manifest profiled {sorted(want)} "
                f"(trace from a different run)"
            )
        spans.append((span, tr.path))
    first, first_path = spans[0]
    for span, p in spans[1:]:
        if span.start_us > first.end_us or span.end_us < first.start_us:
            raise UserError(
                f"{p}: its steps do not overlap in time with {first_path}'s "
                f"(traces from different runs mixed)"
            )
