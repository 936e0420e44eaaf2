"""calibration.json: the fitted cost coefficients the analysis writes and the optimizer reads.

This module owns the file: its format name and version, the dataclasses it holds (`Calibration`,
and from `sparselift.calibration_parts` one `OpFit` per op kind, `Provenance`, `HeldOut`) and
the checks made when it is read. The analysis builds a
`Calibration` (`sparselift.analysis.fit.fit_evidence`) and saves it; the optimizer loads it and lays
its fits over a topology preset (`sparselift.optimizer.coefficients.coefficients`). The fields'
meaning and units are in docs/CONTRACTS.md.

Only the fields a reader needs are required: fields that are absent read as their "not measured"
value (None, or 0 where the sum does not change), so that a hand-written calibration with just
`ops` still prices a plan. A field that is present with the wrong type is refused, naming the file
and the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparselift.atomic import json_bytes, write_bytes
from sparselift.calibration_parts import (
    HeldOut,
    OpFit,
    Provenance,
    read_held_out,
    read_op_fit,
    read_provenance,
)
from sparselift.errors import UserError
from sparselift.jsonfile import (
    optional,
    optional_bool,
    optional_number,
    optional_seconds,
    read_versioned,
    strings,
)
from sparselift.kernels import LookupUnit

FORMAT = "sparselift-calibration"
VERSION = 1
WHAT = "calibration file"  # how error messages name the file
# unit of each op kind's x, as the analysis fits it (the optimizer ignores a lookup fit in another);
# a profile has the output kinds of the sharding types it ran (all-to-all, reduce-scatter or both)
UNITS = {
    "lookup_fwd": "work",
    "lookup_bwd": "work",
    "input_dist": "bytes",
    "output_dist_fwd": "bytes",
    "output_dist_bwd": "bytes",
    "output_dist_rs_fwd": "bytes",
    "output_dist_rs_bwd": "bytes",
    "dp_allreduce": "bytes",
}
# Row-wise and table-row-wise tables' output distribution is a reduce-scatter (gloo runs it as an
# all-reduce), another collective than the all-to-all of the other types: their output_dist calls
# are fitted as their own kinds, `output_dist_rs_fwd` / `_bwd` (x = bytes, as the all-to-all's)
REDUCE_SCATTER_TYPES = ("row_wise", "table_row_wise")
RS_KIND = {"output_dist_fwd": "output_dist_rs_fwd", "output_dist_bwd": "output_dist_rs_bwd"}
A2A_KIND = {rs: a2a for a2a, rs in RS_KIND.items()}  # the all-to-all kind each is priced like
# the sharding type whose tables look up with FBGEMM's dense TBE (no fused optimizer): their
# backward is priced as `lookup_bwd`'s per-unit cost times its `dense_scale`
DENSE_KERNEL_TYPE = "data_parallel"
# unit of `batch_transform`'s x (ids routed; its a_s is per split feature): an op kind that only
# profiles which timed the batch transform have, hence not among UNITS, which every profile fits
# (but for the output kinds of sharding types it did not run)
TRANSFORM_UNIT = "ids"
# unit of `recombine`'s x (pooled elements the split model's recombination reads and writes)
RECOMBINE_UNIT = "elements"
# the trainer's dense optimizer pass over data-parallel tables' weights (x = their elements):
# an op kind only calibrations of profiles with different data-parallel tables have
DENSE_OPTIMIZER, DENSE_OPTIMIZER_UNIT = "dense_optimizer", "elements"


@dataclass
class Calibration:
    """The content of calibration.json.

    Attributes:
        device: "cpu" or "cuda"; None when not recorded (the fits then apply to any device).
        backend: the process-group backend profiled ("gloo", "nccl").
        world_size: ranks profiled.
        batch_size: per-rank batch profiled.
        ops: the fit of each op kind present, by kind.
        dense_step_s: dense forward + backward + optimizer per step; None when not measured.
        provenance: where the calibration comes from.
        pipeline_overlap: share of input_dist the sparse-dist pipeline hides; None (not
            measured: it takes a profile of the plan under each pipeline) leaves the topology's.
        pipeline_overhead_s: the sparse-dist pipeline's own cost per step, measured with the
            overlap; None leaves the topology's (a calibration from before it was measured: its
            overlap was fitted net of the topology's overhead).
        pipeline_profiles: the base and the sparse-dist profile both were measured on ([] when
            not measured, or not recorded).
        pipeline_pays: whether those two profiles measured the pipeline faster (the saving at
            the low end of its interval); None where not recorded (a calibration whose overlap
            was that low end's share: its cost model's verdict stands).
        held_out: with several profiles, each one's leave-one-out prediction ([] otherwise).
        type_overhead_s: what one model-parallel sharding type adds to a step beyond its
            fitted calls, measured where profiles ran different numbers of such types
            (`analysis.type_overhead`; `dense_step_s` is then the residual without it); None
            where not measured.
        lookup_rank_spread: the relative standard error of a rank's own predicted lookups,
            measured within profiles (`analysis.rank_spread`): what the cost model adds to a
            step for its slowest rank (`sparselift.spread`); None where not measured (fewer
            than two ranks beyond one per profile).
        split_cost_profiles: the profiles whose steady steps timed a split model's own costs
            (`batch_transform` and `recombine` are then scaled to what those steps paid); []
            where the fits are the profiler's stand-alone timings only.
    """

    device: str | None
    backend: str | None
    world_size: int | None
    batch_size: int | None
    ops: dict[str, OpFit]
    dense_step_s: float | None
    provenance: Provenance = field(default_factory=Provenance)
    pipeline_overlap: float | None = None
    pipeline_overhead_s: float | None = None
    pipeline_profiles: list[str] = field(default_factory=list)
    pipeline_pays: bool | None = None
    held_out: list[HeldOut] = field(default_factory=list)
    type_overhead_s: float | None = None
    lookup_rank_spread: float | None = None
    split_cost_profiles: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object written to calibration.json (keys in file order)."""
        out: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "provenance": dataclasses.asdict(self.provenance),
            "device": self.device,
            "backend": self.backend,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "ops": {kind: dataclasses.asdict(fit) for kind, fit in self.ops.items()},
            "dense_step_s": self.dense_step_s,
        }
        if self.pipeline_overlap is not None:
            out["pipeline_overlap"] = self.pipeline_overlap
        if self.pipeline_overhead_s is not None:
            out["pipeline_overhead_s"] = self.pipeline_overhead_s
        if self.type_overhead_s is not None:
            out["type_overhead_s"] = self.type_overhead_s
        if self.lookup_rank_spread is not None:
            out["lookup_rank_spread"] = self.lookup_rank_spread
        if self.pipeline_profiles:
            out["pipeline_profiles"] = list(self.pipeline_profiles)
        if self.pipeline_pays is not None:
            out["pipeline_pays"] = self.pipeline_pays
        if self.split_cost_profiles:
            out["split_cost_profiles"] = list(self.split_cost_profiles)
        if self.held_out:
            out["held_out"] = [dict(dataclasses.asdict(h), error=h.error) for h in self.held_out]
        return out

    def to_bytes(self) -> bytes:
        """calibration.json's bytes (built whole, so they can be written atomically later)."""
        return json_bytes(self.to_dict())

    def save(self, path: str | Path) -> None:
        """Write calibration.json to `path` atomically (a temp file, then rename)."""
        write_bytes(path, self.to_bytes())

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], where: str = "calibration") -> Calibration:
        """A Calibration from calibration.json's object (`format` and `version` not checked here).

        Args:
            doc: the decoded JSON object, or a dict built in code with at least `ops`.
            where: what to name in error messages (the file's path).
        Returns:
            The Calibration; absent optional fields take their "not measured" value.
        Raises:
            UserError: `ops` is missing, an op lacks numeric a_s and b_s, or a field present has
                the wrong type; the message names `where` and the field.
        """
        if not isinstance(doc, Mapping):
            raise UserError(f"{where}: a calibration must be a JSON object")
        ops = doc.get("ops")
        if not isinstance(ops, Mapping):
            raise UserError(f'{where}: a calibration file needs "ops"')
        prov = doc.get("provenance")
        if prov is not None and not isinstance(prov, Mapping):
            raise UserError(f"{where}: provenance must be an object")
        dense_step_s = optional_seconds(doc, "dense_step_s", where)
        type_overhead_s = optional_seconds(doc, "type_overhead_s", where)
        for key in ("world_size", "batch_size"):
            n = optional(doc, key, int, where)
            if n is not None and n < 1:
                raise UserError(f"{where}: {key} must be at least 1, got {n}")
        return cls(
            device=optional(doc, "device", str, where),
            backend=optional(doc, "backend", str, where),
            world_size=optional(doc, "world_size", int, where),
            batch_size=optional(doc, "batch_size", int, where),
            ops={str(kind): read_op_fit(kind, op, where) for kind, op in ops.items()},
            dense_step_s=dense_step_s,
            provenance=read_provenance(prov or {}, where),
            pipeline_overlap=optional_number(doc, "pipeline_overlap", where),
            pipeline_overhead_s=optional_number(doc, "pipeline_overhead_s", where),
            pipeline_profiles=strings(doc, "pipeline_profiles", where),
            pipeline_pays=optional_bool(doc, "pipeline_pays", where),
            held_out=read_held_out(doc.get("held_out"), where),
            type_overhead_s=type_overhead_s,
            lookup_rank_spread=_share(doc, "lookup_rank_spread", where),
            split_cost_profiles=strings(doc, "split_cost_profiles", where),
        )

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read and check calibration.json.

        Raises:
            UserError: the file is missing or unreadable, not JSON, not a calibration of this
                version, or a field is wrong (`from_dict`); the message names the file.
        """
        return cls.from_dict(read_checked(path), str(path))


def lookup_unit(ops: Mapping[str, OpFit]) -> LookupUnit:
    """The CPU lookup unit that the lookup fits among `ops` count x in: the kernel benchmark's
    weights (and no footprint term) where a fit did not refit them."""
    kw: dict[str, float] = {}
    for kind, side in (("lookup_fwd", "fwd"), ("lookup_bwd", "bwd")):
        fit = ops.get(kind)
        if fit is not None and fit.unique_weight is not None:
            kw[f"unique_{side}"] = fit.unique_weight
        if fit is not None and fit.bag_weight is not None:
            kw[f"bag_{side}"] = fit.bag_weight
        if fit is not None and fit.footprint_weight is not None:
            kw[f"footprint_{side}"] = fit.footprint_weight
    return LookupUnit(**kw)


def read_checked(path: str | Path) -> dict[str, Any]:
    """calibration.json's JSON object after the checks `Calibration.load` makes.

    For readers that still take the plain object (e.g. the optimizer's topology choice).

    Raises:
        UserError: as `Calibration.load`.
    """
    doc = read_versioned(path, FORMAT, VERSION, WHAT)
    Calibration.from_dict(doc, str(path))
    return doc


MAX_SPREAD = 10.0  # a relative error beyond this is no measurement


def _share(doc: Mapping[str, Any], key: str, where: str) -> float | None:
    """`optional_number`, and UserError unless it is in 0..MAX_SPREAD."""
    v = optional_number(doc, key, where)
    if v is not None and not 0.0 <= v <= MAX_SPREAD:
        raise UserError(f"{where}: {key} must be a share in 0..{MAX_SPREAD:g}, got {v:g}")
    return v
