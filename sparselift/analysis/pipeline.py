"""The analysis stage's front door: a profile directory → `Analysis` (graph, summary, calibration).

Everything is computed before anything is written, and each output file is written to a temp name
then renamed, so bad input leaves no output behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sparselift.analysis.evidence import ProfileEvidence, gather_evidence
from sparselift.analysis.fit import fit_evidence
from sparselift.analysis.names import SPARSE_STAGES
from sparselift.analysis.rankwork import RankedProfile, load_ranks
from sparselift.analysis.reconstruct import merge_graph
from sparselift.analysis.summary import pick_critical, with_imbalance
from sparselift.atomic import file_in_the_way, parquet_bytes, write_bytes
from sparselift.calibration import Calibration
from sparselift.errors import UserError

OUTPUTS = ("nodes.parquet", "edges.parquet", "summary.parquet", "calibration.json")


@dataclass
class Analysis:
    """Everything `analyze` computes, for the CLI, notebooks and benchmarks.

    Attributes:
        nodes: the sparse-path graph's nodes (`reconstruct.NODE_COLUMNS`; nodes.parquet).
        edges: its edges (src, dst, kind; edges.parquet).
        steps: measured steps per rank (rank, step, start_us, end_us, dur_s).
        summary: where each rank's step went (`summary.SUMMARY_COLUMNS`; summary.parquet).
        critical_path: the slowest rank's sparse path per step (`summary.critical_path`).
        calibration: the fitted coefficients (calibration.json).
        unplaced: one line per event or collective that could not be placed.
        manifest: the profile's manifest, as read and checked.
        access_stats: the profile's access statistics, if it has them.
        evidence: the samples the calibration was fitted on (for fitting several profiles
            together, `joint.fit_jointly`).
    """

    nodes: pd.DataFrame
    edges: pd.DataFrame
    steps: pd.DataFrame
    summary: pd.DataFrame
    critical_path: pd.DataFrame
    calibration: Calibration
    unplaced: list[str]
    manifest: dict[str, Any]
    access_stats: pd.DataFrame | None
    evidence: ProfileEvidence


def analyze(
    path: str | Path,
    cache: bool = True,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    allow_missing_ranks: bool = False,
) -> Analysis:
    """Parse, rebuild and calibrate the profile directory `path`.

    Each rank's trace is parsed, and everything that needs only that rank made from it, in a
    worker process (`rankwork.load_ranks`); this process merges those compact per-rank results
    (`merge_ranks`), so it never holds a trace's events and what it does grows with the ranks'
    nodes, not with their events. The result is the same whatever the number of workers.

    Args:
        path: a profile directory written by `sparselift profile` or `ProfileSession`.
        cache: read and write the per-rank parsed-trace cache (Parquet beside the traces).
        progress: called with one line per parsed trace, if given.
        workers: processes for the per-rank work (None: one per core, at most one per rank).
        allow_missing_ranks: analyze the ranks whose traces are there (`profile.load_profile`);
            the calibration's manifest keeps the run's `missing_ranks`.

    Returns:
        The Analysis; nothing is written.

    Raises:
        UserError: the directory is not a complete profile, or a rank has no sparse-path events.
    """
    run = load_ranks(
        path,
        cache=cache,
        progress=progress,
        workers=workers,
        allow_missing_ranks=allow_missing_ranks,
    )
    return merge_ranks(run, path)


def merge_ranks(run: RankedProfile, path: str | Path) -> Analysis:
    """The Analysis of a profile's per-rank results (`rankwork.load_ranks`): what compares ranks
    is computed here, on the ranks' compact frames (collective pairing and peer edges, imbalance,
    the slowest rank per step, the quieter steps, the calls' transfer), then the calibration.

    Args:
        run: the checked profile with every rank's result, in rank order.
        path: the profile directory as given (messages, provenance).
    Raises:
        UserError: a rank has no sparse-path events, or as `evidence.gather_evidence`; a rank
            whose share its worker could not make raises its error here, the lowest rank first.
    """
    n = len(run.results)
    shares = [run.share_of(i) for i in range(n)]  # rank order: the first failing rank raises
    graph = merge_graph([s.graph for s in shares])
    has_sparse = set(graph.nodes.loc[graph.nodes["stage"].isin(SPARSE_STAGES), "rank"].unique())
    for r in run.results:
        if r.rank not in has_sparse:
            raise UserError(
                f"{r.path}: no sparse-path events (no TorchRec input_dist / lookup / output_dist "
                f"annotations in the profiled steps)"
            )
    summary = with_imbalance(pd.concat([s.summary for s in shares], ignore_index=True))
    manifest = {**run.files.manifest, "missing_ranks": missing_of(run)}
    evidence = gather_evidence(
        [run.calls_of(i) for i in range(n)],
        graph.nodes,
        graph.steps,
        manifest,
        str(path),
        run.access_stats,
        run.plan_tables,
    )
    critical = pick_critical(pd.concat([s.critical for s in shares], ignore_index=True), summary)
    return Analysis(
        nodes=graph.nodes,
        edges=graph.edges,
        steps=graph.steps,
        summary=summary,
        critical_path=critical,
        calibration=fit_evidence([evidence]),
        unplaced=graph.unplaced,
        manifest=run.files.manifest,
        access_stats=run.access_stats,
        evidence=evidence,
    )


def missing_of(run: RankedProfile) -> list[int]:
    """The ranks of the run whose traces were left out (`allow_missing_ranks`)."""
    return sorted(set(range(int(run.files.manifest["world_size"]))) - set(run.files.ranks))


def check_output_dir(out: Path) -> None:
    """Refuse an output directory that cannot be created, before any work is done.

    Raises:
        UserError: "cannot write <out>: <file> is not a directory" when `out` or one of its
            ancestors is a regular file.
    """
    blocking = out if out.exists() and not out.is_dir() else file_in_the_way(out)
    if blocking is not None:
        raise UserError(f"cannot write {out}: {blocking} is not a directory")


def write_outputs(a: Analysis, out: Path) -> None:
    """Write the four OUTPUTS of `a` into directory `out`, each atomically.

    The bytes are all built before the first write, so a failure leaves no partial set.

    Args:
        a: what `analyze` returned.
        out: the output directory, created if missing.

    Raises:
        UserError: `out` cannot be created.
    """
    blobs = {
        name: parquet_bytes(df)
        for name, df in (
            ("nodes.parquet", a.nodes),
            ("edges.parquet", a.edges),
            ("summary.parquet", a.summary),
        )
    }
    blobs["calibration.json"] = a.calibration.to_bytes()
    check_output_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out}: cannot create output directory ({e.strerror})") from None
    for name in OUTPUTS:
        write_bytes(out / name, blobs[name])
