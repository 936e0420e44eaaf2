"""Cost coefficients: duration ≈ a_s + b_s·x per op kind, from a calibration or a preset.

A calibration (`sparselift.calibration`, written by `sparselift analyze`) fits op kinds on the
profiled device (and, from a plan profiled under each pipeline, the sparse-dist pipeline's overlap
and overhead); the topology preset supplies the rest (inter-host bytes, UVM reads, quantization)
and everything when planning for hardware that was never profiled. Calibrated
coefficients carry over by op kind only to a topology of the same device kind.

Every coefficient carries its evidence (`Coefficients.evidence`): *measured* (from which profile)
or *assumed* (from which preset). `from_topology` marks all of them assumed; `coefficients` marks
what the calibration replaced as measured. Row-wise and table-row-wise tables' output distribution
(a reduce-scatter) has its own coefficients, `output_dist_rs_fwd` / `_bwd`: measured where a
calibrated profile ran such a table, else the all-to-all's (the preset's, or the calibration's
fit) by analogy, assumed. The optimizer reads it to refuse options whose pay-off
rests only on assumptions, and writes it into every plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.calibration import (
    A2A_KIND,
    DENSE_OPTIMIZER,
    UNITS,
    Calibration,
    HeldOut,
    lookup_unit,
)
from sparselift.calibration_parts import unmeasured_note
from sparselift.kernels import (
    CPU_CALL_S,
    CPU_DIST_B_S,
    CPU_WORK_B_S,
    FOOTPRINT_FLOOR_BYTES,
    KERNEL_UNIT,
    LookupUnit,
)
from sparselift.optimizer.topology import Topology
from sparselift.optimizer.wire import DIST_KINDS, every_byte_crossed_hosts, quantize_from_net

LOOKUP_UNIT = UNITS["lookup_fwd"]  # what analysis writes as the lookups' `x`
OP_KINDS = (
    "lookup_fwd",
    "lookup_bwd",
    "input_dist",
    "output_dist_fwd",
    "output_dist_bwd",
    "output_dist_rs_fwd",
    "output_dist_rs_bwd",
    "dp_allreduce",
)


@dataclass(frozen=True)
class Linear:
    """duration = a_s + b_s · x for one call handling x units."""

    a_s: float  # fixed cost per call
    b_s: float  # seconds per unit of x

    def __call__(self, x: float) -> float:
        """Seconds for one call handling `x` units."""
        return self.a_s + self.b_s * x


@dataclass(frozen=True)
class Coefficients:
    """Everything the cost model multiplies resource counts by. Frozen: a cache key."""

    lookup_fwd: Linear  # x = lookup work on the rank (`sparselift.kernels.lookup_work`)
    lookup_bwd: Linear  # same unit (backward + fused optimizer)
    input_dist: Linear  # x = bytes of ids/lengths sent by the rank (intra-host)
    output_dist_fwd: Linear  # x = bytes of pooled embeddings moved by the rank (intra-host)
    output_dist_bwd: Linear  # (the all-to-all of table-wise and column-wise tables)
    output_dist_rs_fwd: Linear  # same unit: the reduce-scatter of row-wise and table-row-wise
    output_dist_rs_bwd: Linear
    dp_allreduce: Linear  # x = ring-allreduce bytes per rank
    wire_b_s: float  # seconds per byte on the wire inside a host: the part of a collective's
    #                  per-byte cost that lower precision saves (host work per byte stays)
    inter_host_b_s: float  # seconds per byte that crosses hosts (any collective)
    dense_grad_b_s: float  # dense-kernel optimizer: seconds per element of the whole table
    uvm_miss_b_s: float  # extra seconds per element gathered from host memory (UVM cache miss)
    quantize_b_s: float  # seconds per element quantized or dequantized (qcomm)
    dp_overlap: float  # share of the DP allreduce hidden behind backward
    pipeline_overlap: float  # share of input_dist the sparse-dist pipeline hides
    pipeline_overhead_s: float  # the sparse-dist pipeline's own cost per step
    dense_step_s: float  # dense forward+backward+optimizer per step (a constant of the plan)
    source: str  # "preset <name>" or the calibration path
    lookup_unit: LookupUnit = KERNEL_UNIT  # CPU lookups' work unit (κ, μ) the lookup fits count
    # data-parallel tables' backward (the dense TBE, no fused optimizer) per unit of work, as a
    # multiple of lookup_bwd's b_s (the calibration's `dense_scale`; else assumed alike)
    dense_bwd_scale: float = 1.0
    # a plan with splits: the loader's batch transform, x = ids routed (a_s per split feature)
    batch_transform: Linear = Linear(0.0, 0.0)
    # … and the split model's recombination of pooled embeddings: seconds per element (fwd + bwd)
    recombine_b_s: float = 0.0
    # the framework work one model-parallel sharding type adds to a step beyond its calls
    type_overhead_s: float = 0.0
    # the sharding types the calibrated profiles ran (their collectives are what the fits saw);
    # () without a calibration
    profiled_types: tuple[str, ...] = ()
    # per coefficient (COEFFICIENT_NAMES order): (name, MEASURED or ASSUMED, profile or preset);
    # a tuple so that Coefficients stays hashable
    evidence: tuple[tuple[str, str, str], ...] = ()
    # the calibration's largest leave-one-out error, |predicted − measured| ÷ measured over its
    # profiles: how well the model predicts a plan it was not fitted on (None: not measured)
    held_out_error: float | None = None
    # which profile that error is of, and what only it ran ("" where not measured)
    held_out_by: str = ""
    # False where the profiles that measured the pipeline's overlap measured it no faster (at
    # the low end of its interval): then it is not chosen, whatever its overlap prices
    pipeline_pays: bool = True
    # where a host's ranks outnumber its cores, a step lasts at least this × the mean rank's
    # work (`crowding`); 0: each rank on a core of its own (no such bound)
    crowd_factor: float = 0.0
    # a 16-bit output collective's net seconds per element over its fp32 cost inside a host, as
    # a profile measured it (`qcomm_quantize`): priced as it is in both directions. None: the
    # wire model prices it (half the wire's bytes saved, `quantize_b_s` paid at both ends)
    qcomm_net_s: float | None = None
    # the relative standard error of a rank's own predicted lookups (the calibration's
    # `lookup_rank_spread`): a step is priced at its slowest rank's expected end
    # (`sparselift.spread`); 0: each rank's prediction taken as exact
    rank_spread: float = 0.0

    def replace(self, **kw: Any) -> Coefficients:
        """A copy with the fields in `kw` replaced; their evidence is left as it was (callers
        that replace a coefficient with a measured value say so with `with_evidence`)."""
        return dataclasses.replace(self, **kw)

    def with_evidence(self, source: str, origin: str, names: tuple[str, ...]) -> Coefficients:
        """A copy whose coefficients `names` are marked `source` (MEASURED / ASSUMED) from `origin`.

        Raises:
            ValueError: a name that is not a coefficient, or an unknown source.
        """
        if source not in (MEASURED, ASSUMED):
            raise ValueError(f"evidence source must be {MEASURED!r} or {ASSUMED!r}: {source!r}")
        unknown = set(names) - set(COEFFICIENT_NAMES)
        if unknown:
            raise ValueError(f"not coefficients: {sorted(unknown)}")
        old = {name: (src, frm) for name, src, frm in self.evidence}
        for name in names:
            old[name] = (source, origin)
        ev = tuple((n, *old[n]) for n in COEFFICIENT_NAMES if n in old)
        return dataclasses.replace(self, evidence=ev)

    def measured(self, name: str) -> bool:
        """Whether coefficient `name` was measured (from a profile), not assumed."""
        return any(n == name and src == MEASURED for n, src, _ in self.evidence)

    def any_measured(self) -> bool:
        """Whether any coefficient was measured: False when planning for unprofiled hardware."""
        return any(src == MEASURED for _, src, _ in self.evidence)

    def evidence_dict(self) -> dict[str, dict[str, str]]:
        """The plan file's `evidence` block: {coefficient: {"source": …, "from": …}}."""
        return {n: {"source": src, "from": frm} for n, src, frm in self.evidence}


MEASURED, ASSUMED = "measured", "assumed"
# the coefficients a plan's price rests on, in the order plans list them
COEFFICIENT_NAMES = (
    *OP_KINDS,
    "wire_b_s",
    "inter_host_b_s",
    "dense_grad_b_s",
    "dense_bwd_scale",
    "uvm_miss_b_s",
    "quantize_b_s",
    "dp_overlap",
    "pipeline_overlap",
    "pipeline_overhead_s",
    "dense_step_s",
    "lookup_unit",
    "batch_transform",
    "recombine_b_s",
    "type_overhead_s",
    "crowd_factor",
    "rank_spread",
)
# The batch transform's cost per split feature and per id routed, where no profile measured it:
# a few vectorized torch ops per feature on the host (CPU), or on the device (CUDA: launches).
CPU_TRANSFORM = Linear(40e-6, 30e-9)
CUDA_TRANSFORM = Linear(60e-6, 0.1e-9)
# The recombination's seconds per pooled element read (views split, parts added, all concatenated):
# a memory-bound pass forward and backward.
CPU_RECOMBINE_B_S, CUDA_RECOMBINE_B_S = 4e-9, 2e-11


# (seconds per call, seconds per work unit) of fbgemm's CPU TBE (see sparselift/kernels.py)
CPU_LOOKUP = {k: (CPU_CALL_S[k], b) for k, b in CPU_WORK_B_S.items()}


def from_topology(topo: Topology, dense_step_s: float = 0.0) -> Coefficients:
    """The coefficients a topology preset implies, with no calibration.

    Args:
        topo: the hardware planned for; CPU topologies use fbgemm's and TorchRec's measured CPU
            call costs (`sparselift.kernels`), CUDA ones the preset's rates and latencies.
        dense_step_s: the dense part of a step (a constant of every plan).
    Returns:
        Coefficients whose `source` names the preset, every one marked assumed from it.
    """
    lookup_b = 1.0 / topo.lookup_rate
    comm = Linear(topo.collective_latency_s, 1.0 / topo.intra_host_bw)
    dist = {k: comm for k in ("input_dist", "output_dist_fwd", "output_dist_bwd")}  # rs: as a2a
    if topo.device == "cuda":
        fwd = Linear(topo.kernel_latency_s, lookup_b)
        bwd = Linear(topo.kernel_latency_s, lookup_b * topo.bwd_multiplier)
    else:  # FBGEMM's CPU kernels per unit of `sparselift.kernels.lookup_work`; TorchRec's dists
        fwd, bwd = Linear(*CPU_LOOKUP["lookup_fwd"]), Linear(*CPU_LOOKUP["lookup_bwd"])
        dist = {k: Linear(CPU_CALL_S[k], CPU_DIST_B_S) for k in dist}
    return Coefficients(
        lookup_fwd=fwd,
        lookup_bwd=bwd,
        input_dist=dist["input_dist"],
        output_dist_fwd=dist["output_dist_fwd"],
        output_dist_bwd=dist["output_dist_bwd"],
        output_dist_rs_fwd=dist["output_dist_fwd"],
        output_dist_rs_bwd=dist["output_dist_bwd"],
        dp_allreduce=Linear(topo.collective_latency_s, 1.0 / topo.intra_host_bw),
        wire_b_s=1.0 / topo.intra_host_bw,
        inter_host_b_s=max(1.0 / topo.inter_host_bw, 1.0 / topo.intra_host_bw),
        dense_grad_b_s=lookup_b,  # the dense kernel touches every row: a gather-like pass
        uvm_miss_b_s=(4.0 / topo.hbm_to_ddr_bw) if topo.hbm_to_ddr_bw else 0.0,
        quantize_b_s=1.0 / topo.quant_rate,
        dp_overlap=0.5 if topo.device == "cuda" else 0.0,
        pipeline_overlap=topo.pipeline_overlap,
        pipeline_overhead_s=topo.pipeline_overhead_s,
        dense_step_s=dense_step_s,
        batch_transform=CUDA_TRANSFORM if topo.device == "cuda" else CPU_TRANSFORM,
        recombine_b_s=CUDA_RECOMBINE_B_S if topo.device == "cuda" else CPU_RECOMBINE_B_S,
        source=f"preset {topo.preset or 'file'}",
    ).with_evidence(ASSUMED, f"preset {topo.preset or 'topology file'}", COEFFICIENT_NAMES)


def coefficients(
    topo: Topology,
    calibration: Calibration | Mapping[str, Any] | None = None,
    dense_step_s: float = 0.0,
) -> Coefficients:
    """The preset's coefficients with the calibrated op kinds laid over them.

    A calibration from another device kind is not used (the preset's coefficients are returned).
    Negative fitted slopes or intercepts (noise on few points) are clipped to 0 so that no option
    looks cheaper the more it moves.

    Args:
        topo: the hardware planned for.
        calibration: a Calibration, calibration.json's object (or a dict with at least `ops`), or
            None / {} for the preset alone.
        dense_step_s: the dense part of a step when the calibration does not measure it.
    Returns:
        Coefficients whose `source` is the calibration's profiles (" + " between several fitted
        together; or "calibration"); what the calibration replaced is marked measured from it
        (an op kind with its fixed sync cost), the rest stays assumed from the preset. A
        reduce-scatter output kind the calibration lacks takes its all-to-all kind's calibrated
        coefficients, assumed (by analogy, from the calibration). The
        sparse-dist pipeline's overlap and overhead are measured from the two profiles they
        were fitted on (`Calibration.pipeline_profiles`); a calibration with an overlap but no
        overhead (made before the overhead was measured) keeps the preset's overhead, assumed:
        its overlap was fitted net of it. The
        inter-host per-byte cost is measured from a profile of several one-rank hosts (the
        dearest of its distributions' per-byte fits: every byte crossed hosts), else only where
        the measured intra-host one raised it. A split model's own costs (`batch_transform`,
        `recombine_b_s`) are measured only where a split plan's steady steps timed them
        (`Calibration.split_cost_profiles`): fitted on the profiler's stand-alone timings alone
        they take those values but stay assumed, since a step pays more than a lone call (the
        cost model then prices them at a margin and counts splits as risky). The trainer's
        optimizer pass over data-parallel tables (`dense_grad_b_s`) is measured where profiles
        that replicate different weights measured it (`ops.dense_optimizer`). A data-parallel
        all-reduce profiled at one call size is measured as a bound (`OpFit.bound`), and its
        evidence says so.
    Raises:
        UserError: a calibration object with a wrong field (`Calibration.from_dict`).
    """
    base = from_topology(topo, dense_step_s)
    if not calibration:
        return base
    cal = (
        calibration
        if isinstance(calibration, Calibration)
        else Calibration.from_dict(calibration, "calibration")
    )
    if cal.device is not None and cal.device != topo.device:
        return base
    kw: dict[str, Any] = {}
    for kind in OP_KINDS:
        fit = cal.ops.get(kind)
        # lookups are fitted per unit of `sparselift.kernels.lookup_work`; a fit in another unit
        # (an older calibration) would be read in the wrong unit, so the preset's value stays
        if fit is not None and (not kind.startswith("lookup") or fit.x == LOOKUP_UNIT):
            fixed = fit.a_s + fit.sync_s  # sync_s: distributions only
            kw[kind] = Linear(max(0.0, fixed), max(0.0, fit.b_s))
    scale = cal.ops["lookup_bwd"].dense_scale if "lookup_bwd" in kw else None
    if scale is not None:  # measured where a profile ran data-parallel tables
        kw["dense_bwd_scale"] = max(0.0, scale)
    out_fwd = kw.get("output_dist_fwd", kw.get("output_dist_rs_fwd"))
    qcomm = cal.ops.get("qcomm_quantize")
    if qcomm is not None and out_fwd is not None:  # across hosts the wire model stays
        kw["quantize_b_s"] = quantize_from_net(qcomm.b_s, out_fwd.b_s, base.wire_b_s)
    tx = cal.ops.get("batch_transform")
    if tx is not None:
        kw["batch_transform"] = Linear(max(0.0, tx.a_s), max(0.0, tx.b_s))
    rc = cal.ops.get("recombine")  # x = pooled elements read + written, through the origin
    if rc is not None:
        kw["recombine_b_s"] = max(0.0, rc.b_s)
    optimizer = cal.ops.get(DENSE_OPTIMIZER)
    if optimizer is not None:
        kw["dense_grad_b_s"] = max(0.0, optimizer.b_s)
    dp = cal.ops.get("dp_allreduce")
    if dp is not None and dp.overlap is not None:
        kw["dp_overlap"] = min(1.0, max(0.0, dp.overlap))
    if cal.pipeline_overlap is not None:
        kw["pipeline_overlap"] = min(1.0, max(0.0, cal.pipeline_overlap))
    if cal.pipeline_overhead_s is not None:  # measured with the overlap (else the preset's)
        kw["pipeline_overhead_s"] = max(0.0, cal.pipeline_overhead_s)
    pays = cal.pipeline_pays is not False  # None: an older file's overlap was its low end
    unit = lookup_unit({k: f for k, f in cal.ops.items() if k in kw})
    if unit != KERNEL_UNIT:
        kw["lookup_unit"] = unit
    if cal.dense_step_s is not None:
        kw["dense_step_s"] = cal.dense_step_s
    if cal.type_overhead_s is not None:  # measured with the dense step (else the preset's 0)
        kw["type_overhead_s"] = cal.type_overhead_s
    if cal.lookup_rank_spread is not None:  # the dense step was fitted net of it
        kw["rank_spread"] = cal.lookup_rank_spread
    types = cal.provenance.manifest.get("sharding_types")
    profiled = tuple(str(t) for t in types) if isinstance(types, list) else ()
    crossing = [kw[k].b_s for k in DIST_KINDS if k in kw]
    if crossing and max(crossing) > 0 and every_byte_crossed_hosts(cal):  # bytes between hosts
        kw["inter_host_b_s"] = max(crossing)
    elif "input_dist" in kw:  # bytes crossing hosts cost at least what they cost inside one
        kw["inter_host_b_s"] = max(base.inter_host_b_s, kw["input_dist"].b_s)
        if kw["inter_host_b_s"] == base.inter_host_b_s:
            del kw["inter_host_b_s"]  # the preset's value stands: still an assumption
    profile = cal.provenance.profile
    origin = (
        " + ".join(cal.provenance.profiles)  # fitted on several profiles together
        if cal.provenance.profiles
        else profile
        if profile is not None
        else "calibration"
    )
    analogy = {rs: kw[a2a] for rs, a2a in A2A_KIND.items() if rs not in kw and a2a in kw}
    measured = (
        base.replace(source=origin, **kw, **analogy)
        .with_evidence(MEASURED, origin, tuple(kw))
        .with_evidence(ASSUMED, f"by analogy with the all-to-all, {origin}", tuple(analogy))
    )
    if unit.footprint_fwd or unit.footprint_bwd:  # φ measured, the floor it counts from not
        measured = measured.with_evidence(
            MEASURED,
            f"{origin}; the footprint's floor ({FOOTPRINT_FLOOR_BYTES >> 20} MiB) assumed",
            ("lookup_unit",),
        )
    if dp is not None and dp.bound and "dp_allreduce" in kw:
        measured = measured.with_evidence(
            MEASURED,
            f"{origin}; one call size: its fixed and per-byte costs each at the most the calls "
            "allow (a bound)",
            ("dp_allreduce",),
        )
    piped = tuple(k for k in PIPELINE_NAMES if k in kw)
    if piped and cal.pipeline_profiles:  # measured on the plan's two profiles, one per pipeline
        measured = measured.with_evidence(MEASURED, " + ".join(cal.pipeline_profiles), piped)
    split = tuple(k for k in SPLIT_COST_NAMES if k in kw)
    if split and cal.split_cost_profiles:  # scaled to what split plans' steps paid
        measured = measured.with_evidence(MEASURED, " + ".join(cal.split_cost_profiles), split)
    elif split:  # timed apart from the steps only: what a step pays for them is not measured
        measured = measured.with_evidence(
            ASSUMED, f"timed stand-alone in {origin}; no split plan's steps timed them", split
        )
    worst = max(cal.held_out, key=lambda h: abs(h.error), default=None)
    return measured.replace(
        profiled_types=profiled,
        held_out_error=None if worst is None else abs(worst.error),
        held_out_by="" if worst is None else held_out_label(worst),
        pipeline_pays=pays,
        qcomm_net_s=qcomm.b_s if "quantize_b_s" in kw and qcomm is not None else None,
    )


PIPELINE_NAMES = ("pipeline_overlap", "pipeline_overhead_s")
SPLIT_COST_NAMES = ("batch_transform", "recombine_b_s")  # what a split model adds to a step


def held_out_label(h: HeldOut) -> str:
    """A held-out check named for a planning note: its profile's directory name, and what no
    other profile ran."""
    name = Path(h.profile).name or h.profile
    return name + (f", where {unmeasured_note(h.unmeasured)}" if h.unmeasured else "")
