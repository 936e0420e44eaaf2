"""Each rank's share of the analysis, computed where its trace is parsed; only that share travels.

A worker process parses one rank's trace and makes everything that needs only that rank: its
graph nodes with tables and x, the edges within it, its summary rows, its critical-path rows of
every step, its call samples, and the span of its steps for the profile checks. It returns those
compact frames and drops the events, so the analysing process never holds a trace's events and
merges per-rank results whose size does not depend on how many events a rank recorded
(`pipeline.analyze`). What compares ranks (collective pairing, imbalance, the slowest rank per
step, the quieter steps) is left to the merge.

A rank whose share cannot be made returns none, and the analysing process makes it again where
the one-process analysis would have made it, so that the same error is raised in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from sparselift.analysis.evidence import RankEvidenceContext, evidence_context, rank_calls
from sparselift.analysis.pool import ParseStats, rss_mib
from sparselift.analysis.profile import (
    ProfileFiles,
    StepSpan,
    announce,
    check_ranks,
    check_spans,
    open_profile,
    plan_tables,
    read_access,
    span_or_error,
    timed_per_rank,
)
from sparselift.analysis.reconstruct import RankGraph, rank_graph, rank_nodes
from sparselift.analysis.summary import rank_critical, rank_summary
from sparselift.analysis.trace import Trace, load_trace
from sparselift.errors import UserError


@dataclass(frozen=True)
class RankContext:
    """What every rank's work needs of the profile; sent to each worker (small: no statistics).

    Attributes:
        plan_tables: the plan in force, one row per shard (`profile.plan_tables`).
        evidence: what its call samples need (`evidence.evidence_context`).
    """

    plan_tables: pd.DataFrame
    evidence: RankEvidenceContext


@dataclass
class RankShare:
    """One rank's graph share and the rows made from it alone.

    Attributes:
        graph: its nodes, own edges, steps and unplaced events (`reconstruct.RankGraph`).
        summary: its `summary.rank_summary` rows.
        critical: its `summary.rank_critical` rows (every step).
    """

    graph: RankGraph
    summary: pd.DataFrame
    critical: pd.DataFrame


@dataclass
class RankResult:
    """What a worker returns for one rank: no events.

    Attributes:
        path: the trace.
        rank: the rank it stands for.
        trace_rank, trace_world: its own rank and world size (distributedInfo; None: not there).
        span: its `profile.step_span`, or the UserError that raised.
        share: its share (None: could not be made; `share_of` makes it again to raise).
        calls: its `evidence.rank_calls` (None: could not be made; `calls_of` makes them again).
    """

    path: str
    rank: int
    trace_rank: int | None
    trace_world: int | None
    span: StepSpan | UserError
    share: RankShare | None
    calls: pd.DataFrame | None


def make_share(tr: Trace, rank: int, plan: pd.DataFrame) -> RankShare:
    """One rank's `RankShare` from its parsed trace (`plan`: the plan in force, per shard)."""
    graph = rank_graph(rank_nodes(tr, rank), rank, plan)
    return RankShare(graph, rank_summary(graph.nodes, graph.steps), rank_critical(graph.nodes))


def analyze_rank(path: Path, rank: int, cache: bool, ctx: RankContext) -> tuple[RankResult, float]:
    """In a worker (or here): rank `rank`'s trace parsed and its share made; the process's peak
    RSS (MiB).

    Raises:
        UserError: the trace cannot be parsed (missing, corrupt, not a trace).
    """
    tr = load_trace(path, cache=cache)
    share: RankShare | None = None
    calls: pd.DataFrame | None = None
    try:
        share = make_share(tr, rank, ctx.plan_tables)
    except Exception:  # made again (and raised) by `share_of`, after the profile checks
        pass
    if share is not None:
        try:
            calls = rank_calls(share.graph.nodes, ctx.evidence)
        except Exception:  # made again (and raised) by `calls_of`, where the evidence is merged
            pass
    result = RankResult(tr.path, rank, tr.rank, tr.world_size, span_or_error(tr), share, calls)
    return result, rss_mib()


@dataclass
class RankedProfile:
    """A profile directory, checked, with every rank's result (`analyze_rank`).

    Attributes:
        files: the directory, manifest and traces (`profile.open_profile`).
        results: one per rank analyzed, in rank order.
        access_stats: access_stats.parquet, if present.
        plan_tables: the plan in force, one row per shard.
        context: what the ranks' work was given.
        parse: what parsing and the per-rank work cost.
        cache: whether the parsed-trace cache was used (for making a share again).
    """

    files: ProfileFiles
    results: list[RankResult]
    access_stats: pd.DataFrame | None
    plan_tables: pd.DataFrame
    context: RankContext
    parse: ParseStats
    cache: bool

    def share_of(self, i: int) -> RankShare:
        """Result `i`'s share, made again here where its worker could not (raising its error)."""
        r = self.results[i]
        if r.share is None:
            r.share = make_share(load_trace(r.path, cache=self.cache), r.rank, self.plan_tables)
        return r.share

    def calls_of(self, i: int) -> pd.DataFrame:
        """Result `i`'s call samples, made again here where its worker could not."""
        r = self.results[i]
        if r.calls is None:
            r.calls = rank_calls(self.share_of(i).graph.nodes, self.context.evidence)
        return r.calls


def load_ranks(
    path: str | Path,
    cache: bool = True,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    allow_missing_ranks: bool = False,
) -> RankedProfile:
    """`profile.load_profile`'s reading and checks, each rank's share made in its worker.

    Args:
        path, cache, progress, workers, allow_missing_ranks: as `profile.load_profile`.
    Raises:
        UserError: as `profile.load_profile`, in the same order.
    """
    files = open_profile(path, workers, allow_missing_ranks)
    m = files.manifest
    access: pd.DataFrame | None = None
    access_error: UserError | None = None
    try:  # read first (the workers need it), refused where `load_profile` refuses it
        access = read_access(files.path, m)
    except UserError as e:
        access_error = e
    plan = plan_tables(m)
    ctx = RankContext(plan, evidence_context(m, access, plan))
    announce(files, progress)
    results, stats = timed_per_rank(analyze_rank, files, cache, ctx)
    check_ranks(files, [(r.trace_rank, r.trace_world) for r in results])
    check_spans([(r.span, r.path) for r in results], m)
    if access_error is not None:
        raise access_error
    if progress is not None:
        progress(stats.line())
    return RankedProfile(files, results, access, plan, ctx, stats, cache)
