"""The GPU check's kernel stages: on a CUDA profile, every GPU kernel matched to the sparse stage
whose host op launched it.

A kernel's runtime call's correlation id gives the launch; the node on the launching thread that
holds the launch gives the stage; a kernel whose launch no sparse node holds falls back to its
name (`NAME_KINDS`). The result is the device time of each stage, which the host-side
calibration cannot see. Per step means per rank and step (the check runs 1 rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LOOKUP_KINDS = ("lookup_fwd", "lookup_bwd")
# kernel-name fragments → sparse stage, for kernels whose launch no sparse node holds
NAME_KINDS = (
    ("cache", "uvm_cache"),
    ("backward", "lookup_bwd"),
    ("embedding", "lookup_fwd"),  # fbgemm's forward TBE kernels (…embedding_codegen_forward…)
    ("nccl", "collective"),
)


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
