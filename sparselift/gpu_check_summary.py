"""The GPU check's summary for people: one line per run and per UVM comparison of its report."""

from __future__ import annotations

from typing import Any


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
