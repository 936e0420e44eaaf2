"""What 16-bit collectives cost on the profiled hardware, from profiles of a job at fp32 and at 16
bits.

TorchRec's qcomm codecs quantize the pooled embeddings before the output distribution and
dequantize them after: fewer bytes on the wire, more work on the host. Which wins depends on the
hardware, so it is measured: a profile whose output distribution ran at 16 bits is fitted apart
(per fp32 byte the plan moves, the same unit as the fp32 fit), and the difference of the two
per-byte costs is the net cost of one element at 16 bits (`qcomm_quantize`, x = "element": the
quantize and dequantize work less the wire time saved; negative where 16 bits pay). The
optimizer's cost model turns it back into its quantize cost (`optimizer.coefficients`).
Row-wise tables' reduce-scatter (`with_rs_kinds`) runs through the same codecs: its 16-bit
calls are set apart likewise, compared with the reduce-scatter's own fp32 fit, and count towards
the one net figure per element (the cost model applies it to every output collective).
The calls are timed in the profiled window, where one profile's collectives differ from
another's by noise as much as by their precision. So where a 16-bit profile was profiled in one
side-by-side job with an fp32 profile of the same plan, the net is what their steady steps paid
apart, round by round, per element moved (`steps_net`), and the calls only fit it otherwise.
Either way a saving (a negative net) is counted on only where a 16-bit profile's steady steps
also measured faster than an fp32 profile's of the same plan (`measured_faster`), and is
otherwise taken as 0: 16 bits buy nothing.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterator
from typing import Any

import pandas as pd

from sparselift.analysis.compare import compare_profiles, job_models, spanning
from sparselift.analysis.evidence import ProfileEvidence
from sparselift.analysis.fit import fit_ops
from sparselift.analysis.step_model import with_rs_kinds
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

    Reduce-scatter output distributions are their own kinds (`with_rs_kinds`) here already,
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


def _twins(evidence: list[ProfileEvidence]) -> Iterator[tuple[int, list[str]]]:
    """Per 16-bit profile (its index in `evidence`), the fp32 profiles of the same plan and
    pipeline: models of its twin."""

    def plan(ev: ProfileEvidence) -> tuple[Any, Any]:
        return ev.manifest.get("sharding"), ev.manifest.get("pipeline")

    fp32 = [ev for ev in evidence if not sixteen_bit_kinds(ev.manifest)]
    for i, low in enumerate(evidence):
        if sixteen_bit_kinds(low.manifest):
            yield i, [ev.profile for ev in fp32 if plan(ev) == plan(low)]


def steps_net(evidence: list[ProfileEvidence], apart: pd.DataFrame) -> float | None:
    """The net seconds per element of 16 bits as the steady steps paid it.

    Per 16-bit profile with fp32 models of its plan in its side-by-side job (`_twins`,
    `compare.job_models`): its step less theirs (their median step over the rounds' median
    ratio, `compare.compare_profiles`, averaged over the models), over the elements its 16-bit
    output distributions move a step (`apart`'s fp32 bytes ÷ 4: the median over steps and ranks
    of a rank's step). The mean over such profiles; None where none pairs round by round.
    """
    if apart.empty:
        return None
    nets = []
    for i, twins in _twins(evidence):
        calls = apart[apart["profile"] == i]
        try:
            models = job_models(evidence[i].profile, twins)
            verdicts = [compare_profiles(m, evidence[i].profile) for m in models]
        except UserError:
            continue
        if calls.empty or not verdicts or not all(v.paired_rounds for v in verdicts):
            continue
        extra = statistics.fmean(v.baseline.median_s * (1.0 / v.ratio - 1.0) for v in verdicts)
        elements = float(calls.groupby(["step", "rank"])["x"].sum().median()) / FLOAT_BYTES
        if elements > 0.0:  # calls that moved nothing price no element
            nets.append(extra / elements)
    return statistics.fmean(nets) if nets else None


def measured_faster(evidence: list[ProfileEvidence], confidence: float = CONFIDENCE) -> bool:
    """Whether a 16-bit profile's steps were measured faster than those of an fp32 profile of
    the same plan and pipeline: the low end of the `confidence` interval of their steps' ratio
    (`compare.compare_profiles`) above 1; where that fp32 plan was profiled in the 16-bit
    profile's side-by-side job, above 1 against every model of it there (`compare.job_models`,
    `compare.spanning`). Pairs without enough steady steps say nothing."""
    for i, twins in _twins(evidence):
        low = evidence[i]
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
