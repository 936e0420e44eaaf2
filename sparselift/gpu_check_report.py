"""The GPU check's report: per run its fitted lookup coefficients beside the presets', and per
UVM-cached run its measured miss cost.

The presets are h100x8 and h200x8 at 1 rank (`optimizer.coefficients.coefficients(preset(...))`).
A UVM-cached run's miss cost is (its step − the fused run's step) ÷ (2 · the cost model's miss
elements), the miss elements being Σ over tables of ids · dim · (1 − hot_share(cache_load_factor))
(`TableStats.hot_share`, the share a cache of that size catches) and the 2 because the cost model
charges a miss in the forward and again in the backward. Preset and measurement are then in the
same unit (`Coefficients.uvm_miss_b_s`, seconds per element). The same division of the runs'
difference in GPU kernel time per step (`gpu_check_stages.kernel_stages`) gives the device's own
figure (`miss_b_s_gpu`), free of host overheads.

Per step means per rank and step (the check runs 1 rank).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.gpu_check_stages import LOOKUP_KINDS, kernel_stages
from sparselift.gpu_check_summary import summary_text

FORMAT = "sparselift-gpu-check"
VERSION = 1
PRESETS = ("h100x8", "h200x8")


@dataclass(frozen=True)
class Run:
    """One profiled run of the check: its name, profile directory and plan's kernel.

    Attributes:
        name: the run's label ("tiny_fused", "mh26_uvm_0.1", …).
        profile: its profile directory (analyzed: calibration.json inside).
        kernel: the plan's compute kernel ("fused" or "fused_uvm_caching").
        cache_load_factor: the UVM cache's share of each table; None for fused.
        baseline: the run a UVM run is compared with (same workload, fused); None for fused runs.
        stand_in: the profile is another run's (a --dry-run on CPU has no UVM caching): the
            arithmetic runs, the figures mean nothing.
    """

    name: str
    profile: str
    kernel: str = "fused"
    cache_load_factor: float | None = None
    baseline: str | None = None
    stand_in: bool = False


def preset_coefficients() -> dict[str, dict[str, Any]]:
    """What the GPU presets (1 rank) charge for lookups and UVM misses, in calibration units."""
    from sparselift.optimizer.coefficients import coefficients
    from sparselift.optimizer.topology import preset

    out = {}
    for name in PRESETS:
        c = coefficients(preset(name, 1))
        out[name] = {
            "lookup_fwd": {"a_s": c.lookup_fwd.a_s, "b_s": c.lookup_fwd.b_s},
            "lookup_bwd": {"a_s": c.lookup_bwd.a_s, "b_s": c.lookup_bwd.b_s},
            "uvm_miss_b_s": c.uvm_miss_b_s,
        }
    return out


def step_s(profile: str | Path) -> float:
    """The run's step: median steady step (after the window) where timed, else the median of the
    profiled window's slowest-rank steps.

    Raises:
        UserError: no manifest or no step times in it.
    """
    from sparselift.analysis.profile import read_manifest

    m = read_manifest(Path(profile))
    steady = [float(x) for x in m.get("steady_step_s") or []]
    if steady:
        return statistics.median(steady)
    times = m.get("step_times_s") or []
    first = int(m.get("warmup") or 0)
    window = len(m.get("profiled_steps") or [])
    per_step = [max(t[i] for t in times) for i in range(first, first + window)] if times else []
    if not per_step:
        raise UserError(f"{profile}/manifest.json: no step times")
    return statistics.median(per_step)


def miss_elements(profile: str | Path, load_factor: float) -> float:
    """Elements a UVM cache of `load_factor` misses per step, as the cost model counts them:
    Σ tables ids · dim · (1 − hot_share(load_factor)), ids per step from the profile."""
    from sparselift.optimizer.table_stats import stats_from_profile

    tables, batch = stats_from_profile(profile)
    return sum(
        t.ids_per_sample * batch * t.embedding_dim * (1.0 - t.hot_share(load_factor))
        for t in tables
    )


def _lookup_fits(cal: dict[str, Any]) -> dict[str, Any]:
    fits = {}
    for kind in LOOKUP_KINDS:
        f = cal.get("ops", {}).get(kind)
        if f is not None:
            keys = ("x", "a_s", "b_s", "r2", "n")
            fits[kind] = {k: f.get(k) for k in keys}
    return fits


def report(runs: Sequence[Run]) -> dict[str, Any]:
    """The check's JSON: per run its fits, step, kernel stages and (UVM) miss cost; presets.

    Args:
        runs: the analyzed runs; a UVM run's `baseline` names a fused run among them.
    Returns:
        {"format", "version", "presets": preset_coefficients(), "runs": {name: {...}}}; each run
        has kernel, cache_load_factor, device, step_s, lookup (the calibration's lookup_fwd /
        lookup_bwd fits), vs_presets (fitted b_s ÷ each preset's), kernel_stages, and for UVM runs
        uvm {baseline, extra_step_s, extra_gpu_s (kernel time per step over the baseline's; None
        on CPU), miss_elements_per_step, miss_b_s (from the step), miss_b_s_gpu (from the kernel
        time), vs_presets (miss_b_s ÷ each preset's uvm_miss_b_s)}. Baselines come first.
    Raises:
        UserError: a run's calibration or profile is missing or malformed, or a baseline unknown.
    """
    from sparselift.calibration import read_checked

    presets = preset_coefficients()
    by_name = {r.name: r for r in runs}
    out: dict[str, Any] = {}
    for r in runs:
        cal = read_checked(Path(r.profile, "calibration.json"))
        fits = _lookup_fits(cal)
        entry: dict[str, Any] = {
            "profile": r.profile,
            "kernel": r.kernel,
            "cache_load_factor": r.cache_load_factor,
            "stand_in": r.stand_in,
            "device": cal.get("device"),
            "gpu": ((cal.get("provenance") or {}).get("manifest") or {}).get("gpu"),
            "step_s": step_s(r.profile),
            "lookup": fits,
            "vs_presets": {
                p: {k: _ratio(f["b_s"], presets[p][k]["b_s"]) for k, f in fits.items()}
                for p in PRESETS
            },
            "kernel_stages": kernel_stages(r.profile),
        }
        if r.baseline is not None:
            base = by_name.get(r.baseline)
            if base is None or base.name not in out:
                raise UserError(
                    f"run {r.name}: baseline {r.baseline!r} is not among the runs before it"
                )
            if r.cache_load_factor is None:
                raise UserError(f"run {r.name}: a UVM run needs a cache load factor")
            extra = entry["step_s"] - out[r.baseline]["step_s"]
            miss = miss_elements(r.profile, r.cache_load_factor)
            per = extra / (2.0 * miss) if miss > 0 else None
            ks, base_ks = entry["kernel_stages"], out[r.baseline]["kernel_stages"]
            gpu_extra = (
                ks["gpu_s_per_step"] - base_ks["gpu_s_per_step"]
                if ks["cuda"] and base_ks["cuda"]
                else None
            )
            per_gpu = gpu_extra / (2.0 * miss) if gpu_extra is not None and miss > 0 else None
            entry["uvm"] = {
                "baseline": r.baseline,
                "extra_step_s": extra,
                "extra_gpu_s": gpu_extra,
                "miss_elements_per_step": miss,
                "miss_b_s": per,
                "miss_b_s_gpu": per_gpu,
                "vs_presets": {p: _ratio(per, presets[p]["uvm_miss_b_s"]) for p in PRESETS},
            }
        out[r.name] = entry
    return {"format": FORMAT, "version": VERSION, "presets": presets, "runs": out}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def write_report(runs: Sequence[Run], out: str | Path) -> dict[str, Any]:
    """`report(runs)` written to out/gpu_check.json and its summary to out/gpu_check.txt (each
    atomically, both built before either is written); returns the report."""
    from sparselift.atomic import json_bytes, write_bytes

    rep = report(runs)
    data, text = json_bytes(rep), summary_text(rep).encode()
    write_bytes(Path(out, "gpu_check.json"), data)
    write_bytes(Path(out, "gpu_check.txt"), text)
    return rep
