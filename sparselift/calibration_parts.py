"""The parts of calibration.json below its top level: one op kind's fit (`OpFit`), where the
calibration comes from (`Provenance`) and each profile's leave-one-out check (`HeldOut`), with the
checks made when each is read.

`sparselift.calibration` owns the file and re-exports these; they live apart so that the file's
top level and its parts stay small enough to read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparselift.errors import UserError
from sparselift.jsonfile import (
    MAX_SECONDS,
    is_number,
    optional,
    optional_bool,
    optional_number,
    optional_seconds,
    strings,
)


@dataclass
class OpFit:
    """One op kind's fit: duration_s ≈ (a_s + sync_s) · calls + b_s · x, exposed main-thread time.

    Attributes:
        x: unit of x (`UNITS`); "" when a hand-written file does not say.
        a_s: fixed cost per call (one sharding-type group's TBE kernel, or its distribution;
            `batch_transform`: per split feature).
        b_s: seconds per unit of x.
        r2: coefficient of determination of the fit over its samples.
        n: calls fitted on.
        overlap: share of the collectives' transfer hidden behind other work (informative: a_s and
            b_s already fit exposed time); None when not measured.
        calls: calls per rank and step in the profile (sharding-type groups).
        sync_s: distributions: the step's expected wait per call for ranks arriving at random.
        unique_weight, bag_weight: CPU lookups: the work unit's κ and μ (`kernels.LookupUnit`)
            where the calibration refitted them; None: the kernel benchmark's.
        footprint_weight: CPU lookups: the work unit's φ (ids a distinct row costs more per
            doubling of its shard past `kernels.FOOTPRINT_FLOOR_BYTES`) where the calibration
            measured it; None: no such term.
        bound: the fit's terms are each the most the calls allow, not told apart (dp_allreduce
            profiled at one call size: `analysis.dense_backward.dp_allreduce_fit`).
        dense_scale: lookup_bwd: the data-parallel tables' backward (the dense TBE's, without a
            fused optimizer) per unit of work, as a multiple of b_s; None where no profile ran
            data-parallel tables.
    """

    x: str
    a_s: float
    b_s: float
    r2: float
    n: int
    overlap: float | None = None
    calls: float = 1.0
    sync_s: float = 0.0
    unique_weight: float | None = None
    bag_weight: float | None = None
    footprint_weight: float | None = None
    dense_scale: float | None = None
    bound: bool = False

    def cost(self, x: float, calls: float = 1.0) -> float:
        """Exposed seconds of `calls` calls that handle `x` units in all, never negative."""
        return max(0.0, (self.a_s + self.sync_s) * calls + self.b_s * x)


@dataclass
class Provenance:
    """Where a calibration comes from (informative, except `manifest`, which `optimize` reads for
    the profiled hardware: world_size, local_world_size, device, gpu).

    Attributes:
        profile: the profile directory analyzed.
        created_unix: when the calibration was made (seconds since the epoch).
        manifest: the profile manifest's fields that describe the run.
        samples: per-call samples the fits used.
        step_time_s_median: median measured step time (slowest rank), seconds.
        step_time_s_min: fastest measured step time (slowest rank), seconds.
        profiles: every profile fitted together, when there were several ([] for one).
        steady_step_s_median: median step timed after the profiled window (slowest rank), the
            step the calibration reproduces; None when not timed.
        profiler_inflation: the window's median step ÷ that steady step; None when not timed.
    """

    profile: str | None = None
    created_unix: float | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    samples: int | None = None
    step_time_s_median: float | None = None
    step_time_s_min: float | None = None
    profiles: list[str] = field(default_factory=list)
    steady_step_s_median: float | None = None
    profiler_inflation: float | None = None


@dataclass
class HeldOut:
    """One profile's leave-one-out check: its step predicted by the fit on the other profiles.

    Attributes:
        profile: the profile left out.
        measured_step_s: the step a calibration on it reproduces (its steady step where timed,
            else its fastest profiled step; slowest rank), at the speed of the first profile's
            job (`analysis.job_levels`): as measured ÷ `level`.
        predicted_step_s: that step under the calibration fitted without it.
        level: its job's steps ÷ the first profile's job's (1.0: the same job, or not linked).
        unmeasured: what the profile's plan ran that none of the other profiles did (sharding
            types, 16-bit comm, split tables): its prediction priced those from no measurement
            of them, so its error says how far an unmeasured option may be off, not how far the
            calibration carries.
    """

    profile: str
    measured_step_s: float
    predicted_step_s: float
    level: float = 1.0
    unmeasured: list[str] = field(default_factory=list)

    @property
    def error(self) -> float:
        """(predicted − measured) ÷ measured."""
        return (self.predicted_step_s - self.measured_step_s) / self.measured_step_s


def unmeasured_note(unmeasured: Sequence[str]) -> str:
    """How a held-out check names what only its own profile ran (`HeldOut.unmeasured`)."""
    return f"no other profile ran its {', '.join(unmeasured)}"


def read_op_fit(kind: Any, op: Any, where: str) -> OpFit:
    """One entry of `ops`, checked: numeric a_s and b_s, and the optional fields' types."""
    if not isinstance(op, Mapping) or not all(is_number(op.get(k)) for k in ("a_s", "b_s")):
        raise UserError(f"{where}: op {kind!r} needs numeric a_s and b_s")
    bad = next((k for k in ("a_s", "b_s") if not abs(op[k]) <= MAX_SECONDS), None)
    if bad is not None:  # a fit's intercept or slope may be negative (noise on few points)
        raise UserError(
            f"{where}: op {kind!r}: {bad} must be seconds in ±{MAX_SECONDS:g}, got {op[bad]!r}"
        )
    at = f"op {kind!r}: "
    x = optional(op, "x", str, where, at)
    n = optional(op, "n", int, where, at)
    r2, overlap, calls, unique_w, bag_w, footprint_w, dense_scale = (
        optional_number(op, k, where, at)
        for k in (
            "r2",
            "overlap",
            "calls",
            "unique_weight",
            "bag_weight",
            "footprint_weight",
            "dense_scale",
        )
    )
    sync_s = optional_seconds(op, "sync_s", where, at)
    bound = optional_bool(op, "bound", f"{where}: {at[:-2]}")
    return OpFit(
        x="" if x is None else x,
        a_s=float(op["a_s"]),
        b_s=float(op["b_s"]),
        r2=0.0 if r2 is None else r2,
        n=0 if n is None else n,
        overlap=overlap,
        calls=1.0 if calls is None else calls,
        sync_s=0.0 if sync_s is None else sync_s,
        unique_weight=unique_w,
        bag_weight=bag_w,
        footprint_weight=footprint_w,
        dense_scale=dense_scale,
        bound=bool(bound),
    )


def read_provenance(prov: Mapping[str, Any], where: str) -> Provenance:
    """The `provenance` object, checked field by field."""
    at = "provenance."
    manifest = prov.get("manifest")
    if manifest is not None and not isinstance(manifest, dict):
        raise UserError(f"{where}: {at}manifest must be an object")
    profiles = strings(prov, "profiles", where, at)
    return Provenance(
        profile=optional(prov, "profile", str, where, at),
        created_unix=optional_number(prov, "created_unix", where, at),
        manifest=manifest or {},
        samples=optional(prov, "samples", int, where, at),
        step_time_s_median=optional_number(prov, "step_time_s_median", where, at),
        step_time_s_min=optional_number(prov, "step_time_s_min", where, at),
        profiles=profiles,
        steady_step_s_median=optional_number(prov, "steady_step_s_median", where, at),
        profiler_inflation=optional_number(prov, "profiler_inflation", where, at),
    )


def read_held_out(doc: Any, where: str) -> list[HeldOut]:
    """The optional `held_out` list, checked entry by entry."""
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise UserError(f"{where}: held_out must be a list")
    out = []
    for i, h in enumerate(doc):
        at = f"held_out[{i}]."
        if not isinstance(h, Mapping):
            raise UserError(f"{where}: held_out[{i}] must be an object")
        profile = optional(h, "profile", str, where, at)
        measured = optional_number(h, "measured_step_s", where, at)
        predicted = optional_number(h, "predicted_step_s", where, at)
        level = optional_number(h, "level", where, at)
        if profile is None or measured is None or predicted is None or measured <= 0:
            raise UserError(
                f"{where}: {at[:-1]} needs profile, measured_step_s > 0 and predicted_step_s"
            )
        if level is not None and not (math.isfinite(level) and level > 0):
            raise UserError(f"{where}: {at}level must be a finite number > 0, got {level}")
        unmeasured = strings(h, "unmeasured", where, at)
        out.append(
            HeldOut(profile, measured, predicted, 1.0 if level is None else level, unmeasured)
        )
    return out
