"""The profile directory (manifest.json, rank<R>.trace.json.gz, access_stats.parquet), checked.

Every way a directory can be wrong — a rank's trace missing, a trace from another run or rank, a
file that is not a trace — is found here, before any output is written, and reported as one line
naming the file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.pool import ParseStats, R, rss_mib, run_per_rank, worker_count
from sparselift.analysis.reconstruct import rank_nodes
from sparselift.analysis.trace import Trace, load_trace
from sparselift.errors import UserError
from sparselift.profile_manifest import (  # read_manifest also imported from here by callers
    check_unique_tables,
    read_manifest,
)


@dataclass
class Profile:
    """A profile directory, read and cross-checked.

    Attributes:
        path: the directory.
        manifest: manifest.json's object.
        traces: one per rank analyzed, in rank order (`ranks[i]` is `traces[i]`'s rank).
        access_stats: access_stats.parquet (one row per table, rank and step), if present.
        plan_tables: the plan in force, one row per shard (`plan_tables`).
        parse: what parsing the traces cost.
    """

    path: Path
    manifest: dict[str, Any]
    traces: list[Trace]
    access_stats: pd.DataFrame | None
    plan_tables: pd.DataFrame
    parse: ParseStats | None = None
    ranks: list[int] = field(default_factory=list)

    @property
    def missing_ranks(self) -> list[int]:
        """The ranks of the run whose traces were left out (`allow_missing_ranks`)."""
        return sorted(set(range(int(self.manifest["world_size"]))) - set(self.ranks))


class StepSpan(NamedTuple):
    """The profiled steps a trace holds and the time they span (trace microseconds)."""

    steps: list[int]
    start_us: float
    end_us: float


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


def _parse_one(path: Path, rank: int, cache: bool) -> tuple[Trace, float]:
    """In a worker (or here): one rank's trace (through the cache) with its `rank_nodes` made,
    so that rebuilding the graph is parallel too; and the process's peak RSS in MiB.

    A trace whose nodes cannot be made gets none: `build_graph` makes them again and raises
    then, after `load_profile`'s own checks, as with one worker.
    """
    tr = load_trace(path, cache=cache)
    try:
        tr.rank_nodes = (rank, rank_nodes(tr, rank))
    except Exception:  # re-raised by build_graph, in the order one worker would raise it
        pass
    return tr, rss_mib()


def missing_ranks(d: Path, manifest: dict[str, Any]) -> list[int]:
    """The ranks whose trace the profiler could not bring in (the manifest's `missing_ranks`)
    or that is absent from the directory."""
    listed = {int(r) for r in manifest.get("missing_ranks") or []}
    absent = {
        r
        for r in range(int(manifest["world_size"]))
        if not any((d / f"rank{r}.trace.json{z}").is_file() for z in (".gz", ""))
    }
    return sorted(listed | absent)


@dataclass(frozen=True)
class ProfileFiles:
    """A profile directory's manifest and the rank traces to analyze, found before any is read.

    Attributes:
        path: the directory.
        manifest: manifest.json's object.
        ranks: the ranks to analyze, in order.
        paths: their traces.
        sizes: the traces' sizes on disk, MiB.
        workers: processes to read them with (`worker_count`).
    """

    path: Path
    manifest: dict[str, Any]
    ranks: list[int]
    paths: list[Path]
    sizes: list[float]
    workers: int


def timed_per_rank(
    fn: Callable[..., tuple[R, float]], files: ProfileFiles, *args: Any
) -> tuple[list[R], ParseStats]:
    """`pool.run_per_rank` over the profile's traces, and what it cost (`ParseStats`)."""
    t0 = time.perf_counter()
    results, worker_rss = run_per_rank(fn, files.paths, files.ranks, files.workers, *args)
    wall = time.perf_counter() - t0
    stats = ParseStats(
        len(files.ranks), sum(files.sizes), wall, files.workers, rss_mib(), worker_rss
    )
    return results, stats


def open_profile(
    path: str | Path, workers: int | None = None, allow_missing_ranks: bool = False
) -> ProfileFiles:
    """The profile directory's manifest and every rank's trace, found before any is parsed.

    Raises:
        UserError: not a directory or no valid manifest; a missing rank's trace, unless allowed
            (naming the ranks); no rank left; `workers` below 1.
    """
    d = Path(path)
    if not d.is_dir():
        raise UserError(f"{d}: not a directory")
    m = read_manifest(d)
    check_unique_tables(d, m)
    world = m["world_size"]
    gone = missing_ranks(d, m)
    if gone and not allow_missing_ranks:
        listed = m.get("missing_ranks") or []
        if listed:  # the profiler said so: name them all, and the way out
            raise UserError(
                f"{d / 'manifest.json'}: the traces of rank(s) {', '.join(map(str, gone))} are "
                "missing (see its errors); --allow-missing-ranks analyzes the others"
            )
    ranks = (
        [r for r in range(world) if r not in gone] if allow_missing_ranks else list(range(world))
    )
    if not ranks:
        raise UserError(f"{d}: no rank's trace is there to analyze")
    n = worker_count(len(ranks), workers)
    paths = [trace_path(d, r, m) for r in ranks]
    sizes = [p.stat().st_size / 2**20 for p in paths]
    return ProfileFiles(d, m, ranks, paths, sizes, n)


def announce(files: ProfileFiles, progress: Callable[[str], None] | None) -> None:
    """One progress line per trace, before any is parsed."""
    if progress is not None:
        for i, (p, size) in enumerate(zip(files.paths, files.sizes, strict=True)):
            progress(f"parsing trace {i + 1}/{len(files.ranks)}: {p.name} ({size:.1f} MiB)")


def check_ranks(files: ProfileFiles, found: list[tuple[int | None, int | None]]) -> None:
    """Each trace's own rank and world size (`found[i]`, from its distributedInfo; None where not
    recorded) against the rank it stands for and the manifest's world size.

    Raises:
        UserError: the first trace, in rank order, from another rank or run.
    """
    world = files.manifest["world_size"]
    for r, p, (rank, size) in zip(files.ranks, files.paths, found, strict=True):
        if rank is not None and rank != r:
            raise UserError(
                f"{p}: is rank {rank}'s trace, expected rank {r} (files from different runs mixed?)"
            )
        if size is not None and size != world:
            raise UserError(
                f"{p}: from a run with world size {size}, manifest says {world} "
                f"(traces from different runs mixed)"
            )


def read_access(d: Path, manifest: dict[str, Any]) -> pd.DataFrame | None:
    """The profile's access statistics (access_stats.parquet); None where it has none.

    Raises:
        UserError: the file is there but unreadable.
    """
    sp = d / ((manifest.get("files") or {}).get("access_stats") or "access_stats.parquet")
    if not sp.is_file():
        return None
    try:
        return pd.read_parquet(sp)
    except Exception as e:  # any unreadable parquet is bad input, whatever pyarrow raises
        raise UserError(f"{sp}: unreadable Parquet ({e.__class__.__name__})") from None


def load_profile(
    path: str | Path,
    cache: bool = True,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    allow_missing_ranks: bool = False,
) -> Profile:
    """Read and cross-check a profile directory, parsing the ranks' traces in parallel.

    Each rank's trace is parsed in a worker process (streamed, and cached beside it), and its
    graph nodes made there too (`Trace.rank_nodes`); this process then holds every rank's parsed
    events, for callers that read them (`pipeline.analyze` holds only per-rank results:
    `rankwork.load_ranks`). The result is the same whatever the number of workers. Every rank's
    trace is found before any is parsed.

    Args:
        path: the profile directory.
        cache: read and write the parsed-trace cache beside the traces.
        progress: called with one line per trace before it is parsed, and a last line with
            `ParseStats.line`, if given.
        workers: processes to parse with (`worker_count`: default the cores).
        allow_missing_ranks: analyze the ranks whose traces are there, leaving out those the
            manifest names missing or whose file is absent (at least one rank must remain).
    Raises:
        UserError: names the first bad file (missing, corrupt, from another rank or run), or
            `workers` below 1; a missing rank's trace, unless allowed (naming the ranks).
    """
    files = open_profile(path, workers, allow_missing_ranks)
    announce(files, progress)
    traces, stats = timed_per_rank(_parse_one, files, cache)
    check_ranks(files, [(tr.rank, tr.world_size) for tr in traces])
    check_same_run(traces, files.manifest)
    access = read_access(files.path, files.manifest)
    if progress is not None:
        progress(stats.line())
    return Profile(
        path=files.path,
        manifest=files.manifest,
        traces=traces,
        access_stats=access,
        plan_tables=plan_tables(files.manifest),
        parse=stats,
        ranks=files.ranks,
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
    """Check that the traces come from one run (`check_spans` of their `step_span`s).

    Raises:
        UserError: as `check_spans`.
    """
    check_spans([(span_or_error(tr), tr.path) for tr in traces], manifest)


def span_or_error(tr: Trace) -> StepSpan | UserError:
    """`step_span(tr)`, or the UserError it raises (for `check_spans` to raise in rank order)."""
    try:
        return step_span(tr)
    except UserError as e:
        return e


def check_spans(spans: list[tuple[StepSpan | UserError, str]], manifest: dict[str, Any]) -> None:
    """Check that traces come from one run: the manifest's steps, overlapping in time.

    Ranks of one run profile the same steps at the same time (they meet in collectives).

    Args:
        spans: each trace's `step_span` (or the error it raised) and path, in rank order.
        manifest: the profile's manifest.
    Raises:
        UserError: the first trace without steps or holding other steps than the manifest
            profiled; else the first whose steps do not overlap the first rank's.
    """
    want = manifest.get("profiled_steps")
    checked: list[tuple[StepSpan, str]] = []
    for span, p in spans:
        if isinstance(span, UserError):
            raise span
        if want and span.steps != sorted(want):
            raise UserError(
                f"{p}: holds steps {span.steps}, manifest profiled {sorted(want)} "
                f"(trace from a different run)"
            )
        checked.append((span, p))
    first, first_path = checked[0]
    for span, p in checked[1:]:
        if span.start_us > first.end_us or span.end_us < first.start_us:
            raise UserError(
                f"{p}: its steps do not overlap in time with {first_path}'s "
                f"(traces from different runs mixed)"
            )
