"""One profile's evidence for the calibration: per-call samples and step times, before any fit.

Gathered apart from the fit so that several profiles of a job can be fitted together
(`fit.fit_evidence`). The profiled window runs slower than training does (the profiler records
every op), so where the profile also timed steps after the window, the window's samples are
scaled to the steady step: the profiler's inflation (window ÷ steady, slowest rank, medians) is
taken to slow every part of a step alike, except the lookups where the profiler timed the
embedding kernels themselves in the window and in the steady steps (manifest `lookup_s`, on
CPU): the window slows one kernel call far less than the many small ops around it, so each
rank's traced lookups are scaled by its kernels' own steady ÷ window seconds instead. The
calibration then reproduces the steady step, not the profiled one. The batch transform's timings
(`transform_fit`) and the recombination's (`recombine_fit`) are not scaled to the steady step:
the profiler times them after the window, with nothing attached (only separate jobs' speeds are
levelled, `job_levels.levelled`).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sparselift.analysis.compare import after_window, slowest_rank_steps
from sparselift.analysis.recombine_fit import RecombineSample, recombine_samples_of
from sparselift.analysis.samples import (
    LOOKUPS,
    SAMPLE_COLUMNS,
    X_PARTS,
    LookupContext,
    call_samples,
    lookup_context,
    lookup_parts,
    lookup_work_of,
    with_plan_bytes,
    with_transfer,
)
from sparselift.analysis.transform_fit import TransformSample, samples_of
from sparselift.analysis.volumes import dist_bytes
from sparselift.errors import UserError
from sparselift.profile_manifest import is_sequence_table

PLAN_TABLE_COLUMNS = ["table", "module", "sharding_type", "rank", "rows", "cols"]
MIN_STEADY_STEPS = 3  # steps timed after the window for their median to stand for the steady step
SCALED = ("y", "wait", "transfer")  # the samples' columns that are durations


@dataclass
class ProfileEvidence:
    """One profile's samples.

    Attributes:
        profile: the profile directory.
        manifest: its manifest.
        device: "cpu" or "cuda".
        world_size: ranks profiled.
        calls: per-call samples of its quieter steps (`samples.call_samples`), durations scaled
            to the steady step where it was timed.
        step_s: each profiled step's time, slowest rank (indexed by step), scaled alike.
        dp: its data-parallel allreduce collectives (`dense_backward.dp_allreduce_fit`'s input).
        dense_other_s: the dense work outside forward and backward (the trainer's optimizer
            step, its zero_grad), seconds per rank and quieter step; () where the graph has
            none (`dense_backward.dense_optimizer_fit`'s input).
        target_s: the step the calibration reproduces: the steady step's median where timed,
            else the fastest profiled step (on a shared host, other processes only add time).
        steady_step_s: median step timed after the window; None when fewer than
            MIN_STEADY_STEPS were.
        inflation: the profiled window's median step ÷ steady_step_s; None when not measured.
        lookup_scale: (rank, lookup kind) → what that rank's traced lookups were multiplied by
            (its kernels' steady ÷ window seconds, `lookup_scale`); empty where not timed.
        transform: the batch transform's timings the manifest records ([] where none).
        recombine: the recombination's timings the manifest records ([] where none).
    """

    profile: str
    manifest: dict[str, Any]
    device: str
    world_size: int
    calls: pd.DataFrame
    step_s: pd.Series
    dp: pd.DataFrame
    target_s: float
    steady_step_s: float | None = None
    inflation: float | None = None
    transform: list[TransformSample] = field(default_factory=list)
    recombine: list[RecombineSample] = field(default_factory=list)
    lookup_scale: dict[tuple[int, str], float] = field(default_factory=dict)
    dense_other_s: tuple[float, ...] = ()


def window_inflation(manifest: dict[str, Any], step_s: pd.Series) -> tuple[float, float] | None:
    """(steady step, window ÷ steady) from the manifest's step times; None without enough steps
    after the window.

    The window's steps are the loop's own timings of them where recorded (the same clock as the
    steps after), else the trace's.
    """
    after = after_window(manifest)
    if len(after) < MIN_STEADY_STEPS:
        return None
    warmup, n = int(manifest.get("warmup", 0)), len(manifest.get("profiled_steps") or [])
    window = slowest_rank_steps(manifest)[warmup : warmup + n] or list(step_s)
    steady = statistics.median(after)
    if steady <= 0:
        return None
    return steady, statistics.median(window) / steady


@dataclass(frozen=True)
class RankEvidenceContext:
    """What one rank's call samples need of the profile (`rank_calls`), small enough to send to
    every rank's worker.

    Attributes:
        world_size: ranks profiled (the manifest's).
        device: "cpu" or "cuda".
        lookups: the access statistics and plan as lookup sizing needs them (None: none).
    """

    world_size: int
    device: str
    lookups: LookupContext | None


def evidence_context(
    manifest: dict[str, Any], access: pd.DataFrame | None, plan_tables: pd.DataFrame | None
) -> RankEvidenceContext:
    """The `RankEvidenceContext` of a profile's manifest, access statistics and plan."""
    tables = plan_tables if plan_tables is not None else pd.DataFrame(columns=PLAN_TABLE_COLUMNS)
    sequence = frozenset(t["name"] for t in manifest.get("tables") or [] if is_sequence_table(t))
    return RankEvidenceContext(
        int(manifest["world_size"]),
        manifest.get("device") or "cpu",
        lookup_context(access, tables, sequence),
    )


def rank_calls(nodes: pd.DataFrame, ctx: RankEvidenceContext) -> pd.DataFrame:
    """The call samples of every step of some ranks' nodes, before the ranks are compared: lookups
    sized in work units from their parts (ids, distinct rows, pooled elements), `transfer` not yet
    known (`samples.with_transfer` fills it once collectives are paired across ranks).

    Args:
        nodes: graph nodes of one rank (or more), tables and x attached.
        ctx: what sizing needs (`evidence_context`).
    Returns:
        `samples.call_samples(..., transfer=False)` of those nodes.
    """
    nodes = nodes.copy()
    look = nodes["kind"].isin(LOOKUPS)
    if look.any():
        parts = lookup_parts(nodes[look], ctx.lookups, ctx.world_size)
        nodes.loc[look, "x"] = lookup_work_of(parts, nodes.loc[look, "kind"], ctx.device)
        nodes.loc[look, list(X_PARTS)] = parts[list(X_PARTS)]
    return call_samples(nodes, ctx.world_size, transfer=False)


def profile_evidence(
    nodes: pd.DataFrame,
    steps: pd.DataFrame,
    manifest: dict[str, Any],
    profile_dir: str,
    access: pd.DataFrame | None = None,
    plan_tables: pd.DataFrame | None = None,
) -> ProfileEvidence:
    """Gather one profile's call samples and step times.

    Args:
        nodes: graph nodes (`reconstruct.build_graph`).
        steps: measured step windows per rank (rank, step, dur_s).
        manifest: the profile's manifest (world_size, device, backend, batch_size, tables, …).
        profile_dir: the profile directory, for messages and the provenance.
        access: the profile's access statistics, if recorded.
        plan_tables: the plan in force, one row per shard.
    Returns:
        The evidence (lookup samples carry their parts: ids, distinct rows, pooled elements).
    Raises:
        UserError: the quieter steps have no sparse-path call to fit on, or the manifest's
            batch-transform or recombination record is malformed.
    """
    calls = rank_calls(nodes, evidence_context(manifest, access, plan_tables))
    return gather_evidence([calls], nodes, steps, manifest, profile_dir, access, plan_tables)


def gather_evidence(
    rank_samples: list[pd.DataFrame],
    nodes: pd.DataFrame,
    steps: pd.DataFrame,
    manifest: dict[str, Any],
    profile_dir: str,
    access: pd.DataFrame | None = None,
    plan_tables: pd.DataFrame | None = None,
) -> ProfileEvidence:
    """`profile_evidence` from the ranks' own samples (`rank_calls`, in rank order): the steps
    compared across ranks (the quieter half, by the slowest rank), each call's transfer from the
    collectives paired across ranks, the plan's bytes and the data-parallel allreduces.

    Args:
        rank_samples: `rank_calls` of each rank, in rank order.
        nodes: every rank's graph nodes, collectives paired (`reconstruct.merge_graph`).
        steps, manifest, profile_dir, access, plan_tables: as `profile_evidence` takes them.
    Raises:
        UserError: as `profile_evidence`.
    """
    world = int(manifest["world_size"])
    device = manifest.get("device") or "cpu"
    step_s = steps.groupby("step")["dur_s"].max()
    quiet = step_s.index[step_s <= step_s.median()]
    kept = [c for c in rank_samples if not c.empty]
    calls = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=SAMPLE_COLUMNS)
    calls = calls[calls["step"].isin(quiet)].reset_index(drop=True)
    if calls.empty:
        raise UserError(f"{profile_dir}: no sparse-path samples to calibrate on")
    calls = with_transfer(calls, nodes[nodes["step"].isin(quiet)])
    if (
        access is not None
        and not access.empty
        and plan_tables is not None
        and not plan_tables.empty
    ):
        calls = with_plan_bytes(calls, dist_bytes(access, plan_tables, manifest))
    dp = nodes[(nodes["kind"] == "dp_allreduce") & nodes["step"].isin(quiet)]
    if nodes["kind"].isin(LOOKUPS).any():  # the columns the lookups' parts add to every node
        dp = dp.assign(unique=np.nan, bag_elems=np.nan, far=np.nan)
    other = (
        nodes[
            (nodes["kind"] == "dense_other")
            & (nodes["part"] == "compute")
            & nodes["step"].isin(quiet)
        ]
        .groupby(["rank", "step"])["dur_s"]
        .sum()
    )
    transform = samples_of(manifest, f"{profile_dir}/manifest.json")
    recombine = recombine_samples_of(manifest, f"{profile_dir}/manifest.json")
    ev = ProfileEvidence(
        str(profile_dir),
        manifest,
        device,
        world,
        calls,
        step_s,
        dp,
        float(step_s.min()),
        transform=transform,
        recombine=recombine,
        dense_other_s=tuple(float(v) for v in other),
    )
    steady = window_inflation(manifest, step_s)
    return ev if steady is None else scaled_to_steady(ev, *steady)


def lookup_scale(manifest: dict[str, Any]) -> dict[tuple[int, str], float]:
    """(rank, lookup kind) → the embedding kernels' median steady seconds a step ÷ their median
    window seconds, from the manifest's `lookup_s`; only where the rank timed the window and at
    least MIN_STEADY_STEPS steady steps, both medians > 0."""
    out = {}
    for rank, rec in enumerate(manifest.get("lookup_s") or []):
        window, steady = rec.get("window") or [], rec.get("steady") or []
        if not window or len(steady) < MIN_STEADY_STEPS:
            continue
        for i, kind in enumerate(LOOKUPS):
            w = statistics.median(x[i] for x in window)
            s = statistics.median(x[i] for x in steady)
            if w > 0 and s > 0:
                out[rank, kind] = s / w
    return out


def scaled_to_steady(ev: ProfileEvidence, steady_s: float, inflation: float) -> ProfileEvidence:
    """`ev` with its durations divided by the window's inflation (where it is > 1: a window no
    slower than the steady steps was not slowed by the profiler), its lookups scaled by their
    kernels' own steady ÷ window seconds where the manifest has them (`lookup_scale`), and the
    steady step as target."""
    out = dataclasses.replace(
        slowed(ev, 1.0 / max(inflation, 1.0)),
        target_s=steady_s,
        steady_step_s=steady_s,
        inflation=inflation,
    )
    scale = lookup_scale(ev.manifest)
    if not scale:
        return out
    calls = out.calls.copy()
    for (rank, kind), f in scale.items():
        rows = (ev.calls["rank"] == rank) & (ev.calls["kind"] == kind)
        calls.loc[rows, "y"] = ev.calls.loc[rows, "y"] * f
    return dataclasses.replace(out, calls=calls, lookup_scale=scale)


def slowed(ev: ProfileEvidence, f: float) -> ProfileEvidence:
    """`ev` with every duration it fits on (its calls', steps', data-parallel collectives',
    dense work outside forward and backward, target and steady step) multiplied by `f`."""
    calls = ev.calls.copy()
    calls[list(SCALED)] = calls[list(SCALED)] * f
    dp = ev.dp.copy()
    for col in ("dur_s", "transfer_s"):
        if col in dp:
            dp[col] = dp[col] * f
    steady = None if ev.steady_step_s is None else ev.steady_step_s * f
    other = tuple(v * f for v in ev.dense_other_s)
    return dataclasses.replace(
        ev,
        calls=calls,
        step_s=ev.step_s * f,
        dp=dp,
        target_s=ev.target_s * f,
        steady_step_s=steady,
        dense_other_s=other,
    )
