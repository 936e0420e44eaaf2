"""Rank 0's end of the window: what each rank sends it (`RankReport`), the manifest's facts made
of them (`profile_facts`), and the profile's files (`write_profile`, `write_manifest`).

Rank 0 writes `access_stats.parquet` and then `manifest.json` (the manifest last: its presence
means the profile is complete), and the manifest again once the steady steps are timed.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from sparselift.profiler.access_stats import TableStep
from sparselift.profiler.hot_ids import HOT_IDS
from sparselift.profiler.manifest import (
    ProfileFacts,
    build_manifest,
    table_entries,
    usable_cores,
)
from sparselift.profiler.recombine_cost import RankRecombine
from sparselift.profiler.trace import et_name, trace_name
from sparselift.profiler.transform_cost import RankTransform

if TYPE_CHECKING:  # the session calls these; importing it here would close a circle
    from sparselift.profiler.session import ProfileSession


@dataclass
class RankReport:
    """What one rank sends to rank 0 at the end of the window."""

    rank: int
    device: str
    step_times_s: list[float]
    peak_memory_bytes: int
    files: list[str]
    errors: list[str]
    table_steps: list[TableStep] = field(default_factory=list)
    host: str = ""
    # the cores its process may run on, read where the report is made: on the rank
    cores: int | None = field(default_factory=usable_cores)
    transform: RankTransform | None = None  # its batch-transform timings (`transform_cost`)
    recombine: RankRecombine | None = None  # its recombination timings (`recombine_cost`)


def profile_facts(
    session: ProfileSession,
    reports: list[RankReport],
    alphas: dict[str, float | None],
    hot: dict[str, dict[str, Any]] | None,
    transform: dict[str, Any] | None = None,
    recombine: dict[str, Any] | None = None,
) -> ProfileFacts:
    """The manifest's facts on rank 0 at the end of the window.

    Args:
        session: rank 0's session (what ran: its window, topology, tables, plan and command;
            its `errors`, of which those since the ranks were gathered are added as rank 0's).
        reports: every rank's report, rank 0's first (`gather.gather_to_rank0`); each rank's
            `files` are the trace files that reached the profile directory.
        alphas: each table's fitted Zipf exponent (`access_stats.access_rows`).
        hot: each table's hot-id summary (`hot_ids.record_hot_ids`); None where not written.
        transform: the batch transform's timings (`transform_cost.transform_record`), if any.
        recombine: the recombination's timings (`recombine_cost.recombine_record`), if any.
    Returns:
        The facts; `steady_step_s` empty (the steady steps come later).
    """
    s = session
    batch = next((t.batch_size for r in reports for t in r.table_steps), None)
    return ProfileFacts(
        world_size=s.world_size,
        local_world_size=s.local_world_size,
        device=s.device.type,
        backend=s.backend,
        batch_size=batch,
        warmup=s.first,
        profiled_steps=s.profiled_steps,
        tables=table_entries(s.tables, s.spec_tables, alphas, hot),
        model_tables=s.model_tables,
        splits=s.splits,
        sharding=s.sharding,
        pipeline=s.pipeline,
        step_times_s=[r.step_times_s for r in reports],
        peak_memory_bytes=[r.peak_memory_bytes for r in reports],
        traces=[trace_name(r.rank) for r in reports if trace_name(r.rank) in r.files],
        execution_traces=[et_name(r.rank) for r in reports if et_name(r.rank) in r.files],
        command=s.command if s.command is not None else list(sys.argv),
        workload=s.workload,
        errors=[f"rank {r.rank}: {e}" for r in reports for e in r.errors]
        + [f"rank 0: {e}" for e in s.errors[len(reports[0].errors) :]],  # since gathered
        gpu=torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else None,
        comm_precision=s.comm_precision,
        hot_ids=HOT_IDS if hot is not None else None,
        hosts=[r.host for r in reports],
        host_cores=[r.cores for r in reports],
        missing_ranks=[r.rank for r in reports if trace_name(r.rank) not in r.files],
        batch_transform=transform,
        recombine=recombine,
    )


def write_profile(out_dir: Path, rows: list[dict[str, Any]], facts: ProfileFacts) -> None:
    """access_stats.parquet, then manifest.json (the manifest last: its presence means complete)."""
    from sparselift.profiler.outdir import ACCESS_STATS, write_access_stats

    write_access_stats(Path(out_dir, ACCESS_STATS), rows)
    write_manifest(out_dir, facts)


def write_manifest(out_dir: Path, facts: ProfileFacts) -> None:
    """manifest.json of `facts`, atomically (written again once the steady steps are timed)."""
    from sparselift.atomic import write_json
    from sparselift.profiler.outdir import MANIFEST

    write_json(Path(out_dir, MANIFEST), build_manifest(facts))
