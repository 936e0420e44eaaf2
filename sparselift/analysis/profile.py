"""The profile directory (manifest.json, rank<R>.trace.json.gz, access_stats.parquet), checked.

Every way a directory can be wrong — a rank's trace missing, a trace from another run or rank, a
file that is not a trace — is found here, before any output is written, and reported as one line
naming the file.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.reconstruct import rank_nodes
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


@dataclass(frozen=True)
class ParseStats:
    """What parsing a profile's traces and making each rank's nodes (`_parse_one`) cost.

    Attributes:
        ranks: traces parsed (or read from the cache).
        trace_mib: their total size on disk (MiB, compressed as stored).
        wall_s: wall time from the first trace to the last.
        workers: processes that parsed (1: in this process).
        peak_rss_mib: this process's peak resident memory so far.
        worker_peak_rss_mib: the largest peak of any worker process (None with one worker).
    """

    ranks: int
    trace_mib: float
    wall_s: float
    workers: int
    peak_rss_mib: float
    worker_peak_rss_mib: float | None

    def line(self) -> str:
        """One line for the console."""
        per = (
            f", {self.worker_peak_rss_mib:.0f} MiB per worker"
            if self.worker_peak_rss_mib is not None
            else ""
        )
        return (
            f"parsed {self.ranks} traces ({self.trace_mib:.1f} MiB) and made their nodes in "
            f"{self.wall_s:.2f} s with "
            f"{self.workers} worker{'s' if self.workers > 1 else ''}; peak RSS "
            f"{self.peak_rss_mib:.0f} MiB here{per}"
        )


def worker_count(world: int, workers: int | None = None) -> int:
    """Processes to parse `world` traces with: `workers`, else the cores.

    Never more than `world`.

    Raises:
        UserError: `workers` below 1.
    """
    n = workers if workers is not None else os.cpu_count() or 1
    if n < 1:
        raise UserError(f"workers must be at least 1, got {n}")
    return max(1, min(n, world))


def _rss_mib() -> float:
    """This process's peak resident memory so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _parse_one(path: Path, cache: bool, rank: int) -> tuple[Trace, float]:
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
    return tr, _rss_mib()


def _load_traces(
    paths: list[Path], cache: bool, workers: int, ranks: list[int]
) -> tuple[list[Trace], float | None]:
    """Each path's Trace in order (rank `ranks[i]`), with its nodes, in `workers` processes (1:
    here); and the workers' largest peak RSS (None with one).

    A failing rank raises its error, the lowest rank's first; ranks not yet started are dropped.
    """
    if workers == 1:
        return [_parse_one(p, cache, r)[0] for r, p in zip(ranks, paths, strict=True)], None
    # fork: a worker starts with the trace module imported and needs no importable __main__
    # (scripts and notebooks without a main guard); it only parses, so the threads a fork
    # leaves behind are not missed
    fork = "fork" in multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if fork else None)
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_parse_one, p, cache, r) for r, p in zip(ranks, paths, strict=True)]
        try:
            done = [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return [t for t, _ in done], max(m for _, m in done)


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


def load_profile(
    path: str | Path,
    cache: bool = True,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    allow_missing_ranks: bool = False,
) -> Profile:
    """Read and cross-check a profile directory, parsing the ranks' traces in parallel.

    Each rank's trace is parsed in a worker process (streamed, and cached beside it), and its
    graph nodes made there too (`Trace.rank_nodes`), so this process holds the parsed rows, never
    a decoded JSON document, and the per-rank work runs on every core; the result is the same
    whatever the number of workers. Every rank's trace is found before any is parsed.

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
    d = Path(path)
    if not d.is_dir():
        raise UserError(f"{d}: not a directory")
    m = read_manifest(d)
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
    if progress is not None:
        for i, (p, size) in enumerate(zip(paths, sizes, strict=True)):
            progress(f"parsing trace {i + 1}/{len(ranks)}: {p.name} ({size:.1f} MiB)")
    t0 = time.perf_counter()
    traces, worker_rss = _load_traces(paths, cache, n, ranks)
    stats = ParseStats(len(ranks), sum(sizes), time.perf_counter() - t0, n, _rss_mib(), worker_rss)
    for r, p, tr in zip(ranks, paths, traces, strict=True):
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
    check_same_run(traces, m)
    access = None
    sp = d / ((m.get("files") or {}).get("access_stats") or "access_stats.parquet")
    if sp.is_file():
        try:
            access = pd.read_parquet(sp)
        except Exception as e:  # any unreadable parquet is bad input, whatever pyarrow raises
            raise UserError(f"{sp}: unreadable Parquet ({e.__class__.__name__})") from None
    if progress is not None:
        progress(stats.line())
    return Profile(
        path=d,
        manifest=m,
        traces=traces,
        access_stats=access,
        plan_tables=plan_tables(m),
        parse=stats,
        ranks=ranks,
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
