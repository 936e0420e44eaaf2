"""What 16-bit collectives cost on the profiled hardware, from profiles of a job at fp32 and at 16
bits.

TorchRec's qcomm codecs quantize the pooled embeddings before the output distribution and
dequantize them after: fewer bytes on the wire, more work on the host. Which wins depends on the
hardware, so it is measured: a profile whose output distribution ran at 16 bits is fitted apart
(per fp32 byte the plan moves, the same unit as the fp32 fit), and the difference of the two
per-byte costs is the net cost of one element at 16 bits (`qcomm_quantize`, x = "element": the
quantize and dequantize work less the wire time saved; negative where 16 bits pay). The
optimizer's cost model turns it back into its quantize cost (`optimizer.coefficients`).
Row-wise tables' reduce-scatter (`fit.with_rs_kinds`) runs through the same codecs: its 16-bit
calls are set apart likewise, compared with the reduce-scatter's own fp32 fit, and count towards
the one net figure per element (the cost model applies it to every output collective).
The calls are timed in the profiled window, where one profile's collectives differ from
another's by noise as much as by their precision; so a saving (a negative net) is counted on only
where a 16-bit profile's steady steps also measured faster than an fp32 profile's of the same
plan (`measured_faster`), and is otherwise taken as 0: 16 bits buy nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from sparselift.analysis.compare import compare_profiles, job_models, spanning
from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.fit import fit_ops, with_rs_kinds
from sparselift.calibration import RS_KIND, OpFit
from sparselift.errors import UserError
from sparselift.kernels import FLOAT_BYTES

OUTPUT_KINDS = {"forward": "output_dist_fwd", "backward": "output_dist_bwd"}
QCOMM = "qcomm_quantize"
CONFIDENCE = 0.9  # two-sided, as the pipeline's (`pipeline_overlap`)


def precision_of(manifest: dict[str, Any]) -> dict[str, str]:
    """The profiled run's collective precision per direction (fp32 where not recorded)."""
    cp = manifest.get("comm_precision") or {}
    return {d: str(cp.get(d) or "fp32") for d in OUTPUT_KINDS}


def sixteen_bit_kinds(manifest: dict[str, Any]) -> set[str]:
    """The output-distribution kinds (all-to-all and reduce-scatter) the profiled run ran below
    fp32."""
    low = {OUTPUT_KINDS[d] for d, p in precision_of(manifest).items() if p != "fp32"}
    return low | {RS_KIND[k] for k in low}


def split_by_precision(
    evidence: list[ProfileEvidence],
) -> tuple[list[ProfileEvidence], pd.DataFrame]:
    """The evidence the fp32 fit takes, and the 16-bit output-distribution calls set apart.

    Reduce-scatter output distributions are their own kinds (`fit.with_rs_kinds`) here already,
    in the evidence returned too. A 16-bit kind is set apart only where some profile ran that
    kind at fp32 (else there is no fp32 line to compare with, and its calls are all the evidence
    the kind has).

    Returns:
        (the evidence without those calls, the calls set apart with a `profile` column)
    """
    evidence = [dataclasses.replace(ev, calls=with_rs_kinds(ev.calls)) for ev in evidence]
    outputs = [*OUTPUT_KINDS.values(), *RS_KIND.values()]
    at32 = {
        k
        for ev in evidence
        for k in outputs
        if k not in sixteen_bit_kinds(ev.manifest) and (ev.calls["kind"] == k).any()
    }
    kept, apart = [], []
    for i, ev in enumerate(evidence):
        low = sixteen_bit_kinds(ev.manifest) & at32
        mask = ev.calls["kind"].isin(low)
        if mask.any():
            apart.append(ev.calls[mask].assign(profile=i))
            ev = dataclasses.replace(ev, calls=ev.calls[~mask])
        kept.append(ev)
    return kept, (pd.concat(apart, ignore_index=True) if apart else pd.DataFrame())


def fit_qcomm(apart: pd.DataFrame, ops: dict[str, OpFit]) -> OpFit | None:
    """The net seconds per element of a 16-bit output distribution over its fp32 cost.

    Each kind's 16-bit calls are fitted with the fp32 fit's fixed cost per call (the codecs add
    work per element, not per call); the per-byte difference, times 4 bytes an element, is
    averaged over the kinds weighted by their calls.

    Args:
        apart: the 16-bit calls (`split_by_precision`).
        ops: the fp32 fits.
    Returns:
        The `qcomm_quantize` fit, or None without 16-bit calls of a kind fitted at fp32.
    """
    if apart.empty:
        return None
    net, n = 0.0, 0
    for kind, calls in apart.groupby("kind"):
        fp32 = ops.get(str(kind))
        if fp32 is None:
            continue
        low = fit_ops(calls, {str(kind): fp32.a_s})[str(kind)]
        net += (low.b_s - fp32.b_s) * FLOAT_BYTES * low.n
        n += low.n
    if n == 0:
        return None
    return OpFit(x="element", a_s=0.0, b_s=net / n, r2=0.0, n=n)


def measured_faster(evidence: list[ProfileEvidence], confidence: float = CONFIDENCE) -> bool:
    """Whether a 16-bit profile's steps were measured faster than those of an fp32 profile of
    the same plan and pipeline: the low end of the `confidence` interval of their steps' ratio
    (`compare.compare_profiles`) above 1; where that fp32 plan was profiled in the 16-bit
    profile's side-by-side job, above 1 against every model of it there (`compare.job_models`,
    `compare.spanning`). Pairs without enough steady steps say nothing."""

    def plan(ev: ProfileEvidence) -> tuple[Any, Any]:
        return ev.manifest.get("sharding"), ev.manifest.get("pipeline")

    fp32 = [ev for ev in evidence if not sixteen_bit_kinds(ev.manifest)]
    for low in (ev for ev in evidence if sixteen_bit_kinds(ev.manifest)):
        twins = [ev.profile for ev in fp32 if plan(ev) == plan(low)]
        same = job_models(low.profile, twins)
        for models in [same] if same else [[t] for t in twins]:
            try:
                v = spanning([compare_profiles(m, low.profile, confidence) for m in models])
            except UserError:
                continue
            if v.low > 1.0:
                return True
    return False


def at_precision(ops: dict[str, OpFit], manifest: dict[str, Any]) -> dict[str, OpFit]:
    """`ops` as they price a run at `manifest`'s precision: each 16-bit output kind's per-byte
    cost raised by the net 16-bit cost of an element (`ops` itself without a qcomm fit)."""
    q = ops.get(QCOMM)
    low = sixteen_bit_kinds(manifest)
    if q is None or not low:
        return ops
    out = dict(ops)
    for kind in low & set(ops):
        out[kind] = dataclasses.replace(ops[kind], b_s=ops[kind].b_s + q.b_s / FLOAT_BYTES)
    return out
