"""The GPU check's Python steps (`scripts/gpu_check.sh`): its plans, and its report.

The check profiles a few 1-rank CUDA runs (tiny fused; multihot-26 fused and UVM-cached at two
cache sizes) and needs three things the other commands do not give:

* `write_plan`: a round-robin plan with its tables' compute kernel (and cache load factor) set;
* `kernel_stages`: on a CUDA profile, every GPU kernel matched to the sparse stage whose host op
  launched it (its runtime call's correlation id → the node on the launching thread that holds the
  launch), falling back to the kernel's name — the device time of each stage, which the host-side
  calibration cannot see;
* `report`: per run the fitted lookup coefficients beside the h100x8 / h200x8 presets' own
  (`optimizer.coefficients.coefficients(preset(...))`), and per UVM-cached run its measured miss
  cost: (its step − the fused run's step) ÷ (2 · the cost model's miss elements), the miss elements
  being Σ over tables of ids · dim · (1 − hot_share(cache_load_factor)) (`TableStats.hot_share`,
  the share a cache of that size catches) and the 2 because the cost model charges a miss in the
  forward and again in the backward. Preset and measurement are then in the same unit
  (`Coefficients.uvm_miss_b_s`, seconds per element). The same division of the runs' difference
  in GPU kernel time per step gives the device's own figure (`miss_b_s_gpu`), free of host
  overheads.

Per step means per rank and step (the check runs 1 rank).

`python -m sparselift.gpu_check plan|report …` runs them; bad input is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.errors import UserError

FORMAT = "sparselift-gpu-check"
VERSION = 1
PRESETS = ("h100x8", "h200x8")
LOOKUP_KINDS = ("lookup_fwd", "lookup_bwd")
# kernel-name fragments → sparse stage, for kernels whose launch no sparse node holds
NAME_KINDS = (
    ("cache", "uvm_cache"),
    ("backward", "lookup_bwd"),
    ("embedding", "lookup_fwd"),  # fbgemm's forward TBE kernels (…embedding_codegen_forward…)
    ("nccl", "collective"),
)


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


def write_plan(src: str | Path, dst: str | Path, kernel: str, load_factor: float | None) -> None:
    """Write `src` (a plan file) to `dst` with every table's kernel and cache share set.

    Args:
        src: a SparseLift plan (e.g. from `sparselift plan round-robin`).
        dst: where to write the edited plan (atomically).
        kernel: the compute kernel for every table.
        load_factor: the cache load factor (only with "fused_uvm_caching").
    Raises:
        UserError: `src` is unreadable, or the edited plan fails the plan checks (a UVM kernel on a
            CPU topology, a load factor outside (0, 1]).
    """
    from sparselift.atomic import write_bytes
    from sparselift.plans import load

    try:
        d = json.loads(Path(src).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{src}: cannot read the plan ({e.__class__.__name__})") from None
    if load_factor is not None and not 0 < load_factor <= 1:
        raise UserError(f"{dst}: cache load factor must be in (0, 1], got {load_factor}")
    for t in d.get("tables", []):
        t["compute_kernel"] = kernel
        t["cache_load_factor"] = load_factor
    data = (json.dumps(d, indent=1, sort_keys=True) + "\n").encode()
    tmp = Path(dst).with_name(Path(dst).name + ".check.json")
    write_bytes(tmp, data)
    try:
        load(tmp)  # the plan checks (raises PlanError, a user error)
    finally:
        tmp.unlink(missing_ok=True)
    write_bytes(dst, data)


def kernel_stages(profile: str | Path) -> dict[str, Any]:
    """GPU kernel time of a CUDA profile per sparse stage, matched to the ops that launched it.

    Args:
        profile: a profile directory.
    Returns:
        {"cuda": bool, "kernels": n, "gpu_s_per_step": all kernels' time per step,
        "matched_share": share of kernel time whose launch a sparse node (stage lookup /
        input_dist / output_dist) holds, "by_kind": {kind: {"kernels": n, "gpu_s_per_step": s,
        "via": {"launch": n, "name": n}, and for lookups "work_per_step" (the calibration's
        unit, `kernels.lookup_work`) and "gpu_s_per_unit": the device's own seconds per unit}}};
        kinds are the node kinds (lookup_fwd, …), or from the name (uvm_cache, collective), or
        "other". A CPU profile gives cuda false and no kinds.
    Raises:
        UserError: not a readable profile.
    """
    import pandas as pd

    from sparselift.analysis.names import SPARSE_STAGES
    from sparselift.analysis.profile import load_profile
    from sparselift.analysis.reconstruct import build_graph

    prof = load_profile(profile, cache=True)
    graph = build_graph(prof.traces, prof.plan_tables)
    nodes = graph.nodes[graph.nodes["stage"].isin(SPARSE_STAGES)]
    steps = max(1, int(graph.steps[["rank", "step"]].drop_duplicates().shape[0]))
    by_kind: dict[str, dict[str, Any]] = {}
    total = matched = 0.0
    n = 0
    cuda = False
    for rank, tr in enumerate(prof.traces):
        ev = tr.events
        kernels = ev[ev["cat"] == "kernel"]
        if kernels.empty:
            continue
        cuda = True
        rt = ev[(ev["cat"] == "cuda_runtime") & ev["correlation"].notna()]
        launch = {
            int(c): (f"{p}/{t}", float(ts))
            for c, p, t, ts in zip(rt["correlation"], rt["pid"], rt["tid"], rt["ts"], strict=True)
        }
        mine = nodes[nodes["rank"] == rank]
        spans: dict[str, list[tuple[float, float, str]]] = {}
        for th, s, e, k in zip(
            mine["thread"], mine["start_us"], mine["end_us"], mine["kind"], strict=True
        ):
            spans.setdefault(str(th), []).append((float(s), float(e), str(k)))
        for name, corr, dur in zip(
            kernels["name"], kernels["correlation"], kernels["dur"], strict=True
        ):
            kind, via = None, "name"
            at = launch.get(int(corr)) if pd.notna(corr) else None
            if at is not None:
                kind = next((k for s, e, k in spans.get(at[0], ()) if s <= at[1] <= e), None)
                via = "launch" if kind is not None else via
            if kind is None:
                low = str(name).lower()
                kind = next((k for frag, k in NAME_KINDS if frag in low), "other")
            sec = float(dur) * 1e-6
            total += sec
            matched += sec if via == "launch" else 0.0
            n += 1
            e_ = by_kind.setdefault(kind, {"kernels": 0, "gpu_s": 0.0, "via": {}})
            e_["kernels"] += 1
            e_["gpu_s"] += sec
            e_["via"][via] = e_["via"].get(via, 0) + 1
    # lookup work per step (the calibration's unit), one value per call (rank, step, group)
    lk = nodes[nodes["kind"].isin(LOOKUP_KINDS)]
    calls = lk.groupby(["rank", "step", "kind", "module", "sharding"], dropna=False)["x"].max()
    work = calls.groupby(level="kind").sum() / steps
    out: dict[str, Any] = {}
    for k, v in sorted(by_kind.items()):
        per_step = v["gpu_s"] / steps
        out[k] = {"kernels": v["kernels"], "gpu_s_per_step": per_step, "via": v["via"]}
        if k in LOOKUP_KINDS and float(work.get(k, 0.0)) > 0:
            out[k]["work_per_step"] = float(work[k])
            out[k]["gpu_s_per_unit"] = per_step / float(work[k])
    return {
        "cuda": cuda,
        "kernels": n,
        "gpu_s_per_step": total / steps,
        "matched_share": matched / total if total else None,
        "by_kind": out,
    }


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


def summary_text(rep: dict[str, Any]) -> str:
    """A short summary of `report`'s result for people: one line per run and per UVM comparison."""
    lines = [
        "SparseLift GPU check: fitted lookup cost per work unit vs the presets' (ratio >1: slower)"
    ]
    for p, c in rep["presets"].items():
        lines.append(
            f"  preset {p}: lookup_fwd b={c['lookup_fwd']['b_s']:.3g} s/unit, lookup_bwd "
            f"b={c['lookup_bwd']['b_s']:.3g}, uvm miss {c['uvm_miss_b_s']:.3g} s/element"
        )
    for name, r in rep["runs"].items():
        fits = ", ".join(
            f"{k} a={f['a_s'] * 1e6:.1f}us b={f['b_s']:.3g}/{f['x']} (n={f['n']})"
            for k, f in r["lookup"].items()
        )
        ratios = "; ".join(
            f"{p} " + ", ".join(f"{k} x{v:.2f}" for k, v in kv.items() if v is not None)
            for p, kv in r["vs_presets"].items()
        )
        ks = r["kernel_stages"]
        gpu = "; no GPU kernels"
        if ks["cuda"] and ks["matched_share"] is not None:
            dev = ", ".join(
                f"{k} {v['gpu_s_per_step'] * 1e3:.2f} ms"
                + (f" ({v['gpu_s_per_unit']:.3g}/unit)" if "gpu_s_per_unit" in v else "")
                for k, v in ks["by_kind"].items()
            )
            gpu = (
                f"; {ks['kernels']} GPU kernels, {ks['matched_share']:.0%} of their time matched "
                f"to a sparse stage; per step {dev}"
            )
        tag = " [stand-in]" if r["stand_in"] else ""
        lines.append(
            f"{name}{tag} ({r['device']}, {r['kernel']}): step {r['step_s'] * 1e3:.2f} ms; "
            f"{fits or 'no lookup fit'}{gpu}"
        )
        if ratios:
            lines.append(f"  vs presets: {ratios}")
        u = r.get("uvm")
        if u is not None:
            miss = "n/a" if u["miss_b_s"] is None else f"{u['miss_b_s']:.3g} s/element"
            if u["miss_b_s_gpu"] is not None:
                miss += f" (GPU kernels: {u['miss_b_s_gpu']:.3g})"
            vs = ", ".join(f"{p} x{v:.2f}" for p, v in u["vs_presets"].items() if v is not None)
            lines.append(
                f"  uvm vs {u['baseline']}: {u['extra_step_s'] * 1e3:+.2f} ms/step over "
                f"{u['miss_elements_per_step']:.3g} missed elements (fwd+bwd) -> {miss}"
                + (f" ({vs} the presets')" if vs else "")
            )
    return "\n".join(lines) + "\n"


def write_report(runs: Sequence[Run], out: str | Path) -> dict[str, Any]:
    """`report(runs)` written to out/gpu_check.json and its summary to out/gpu_check.txt (each
    atomically, both built before either is written); returns the report."""
    from sparselift.atomic import json_bytes, write_bytes

    rep = report(runs)
    data, text = json_bytes(rep), summary_text(rep).encode()
    write_bytes(Path(out, "gpu_check.json"), data)
    write_bytes(Path(out, "gpu_check.txt"), text)
    return rep


def parse_run(text: str) -> Run:
    """A run from `NAME=DIR[,kernel=K][,lf=F][,baseline=B][,stand_in=1]`.

    Raises:
        UserError: a malformed run argument.
    """
    head, _, rest = text.partition(",")
    name, eq, profile = head.partition("=")
    if not eq or not name or not profile:
        raise UserError(f"--run {text!r}: expected NAME=DIR[,kernel=K][,lf=F][,baseline=B]")
    kw: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        k, eq, v = part.partition("=")
        if not eq or k not in ("kernel", "lf", "baseline", "stand_in"):
            raise UserError(f"--run {text!r}: unknown option {part!r}")
        if k == "lf":
            try:
                kw["cache_load_factor"] = float(v)
            except ValueError:
                raise UserError(f"--run {text!r}: lf must be a number, got {v!r}") from None
        elif k == "stand_in":
            kw["stand_in"] = v not in ("0", "false", "")
        else:
            kw[k] = v
    return Run(name=name, profile=profile, **kw)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sparselift.gpu_check plan SRC DST --kernel K [--lf F]` or
    `report --out DIR --run NAME=DIR[,…] …`; 0 on success, 2 with one line on bad input."""
    ap = argparse.ArgumentParser(prog="python -m sparselift.gpu_check")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="a plan with every table's kernel (and cache share) set")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--kernel", required=True)
    p.add_argument("--lf", type=float, default=None)
    r = sub.add_parser("report", help="write gpu_check.json and gpu_check.txt")
    r.add_argument("--out", required=True)
    r.add_argument("--run", action="append", required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "plan":
            write_plan(args.src, args.dst, args.kernel, args.lf)
            print(f"wrote {args.dst} ({args.kernel}" + (f", lf {args.lf})" if args.lf else ")"))
        else:
            runs = [parse_run(x) for x in args.run]
            rep = write_report(runs, args.out)
            print(summary_text(rep), end="")
            print(f"wrote {args.out}/gpu_check.json, {args.out}/gpu_check.txt")
    except Exception as e:  # noqa: BLE001 - user errors (ours, PlanError) are one line
        if getattr(e, "is_user_error", False):
            print(f"gpu_check: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["Run", "kernel_stages", "main", "report", "summary_text", "write_plan"]
