"""Analysis at scale: trace MB parsed per second per core and peak memory, as ranks and size grow.

Profiles `tiny` for real (`sparselift profile`) at 2, 4 and 8 ranks, and at 2 ranks with more
profiled steps so that each rank's trace reaches the size of a GPU rank's (tens of MB of JSON).
Each profile is then analysed in a fresh process (no cache), so the figures are that process's:
  parse    — `load_profile` with the default workers (one per core, at most one per rank) and with
             one worker: wall s, JSON MB/s/core (= MB ÷ wall ÷ workers), CPU s of every process;
  memory   — peak RSS of the analysing process, and of the largest worker (per-rank MiB: what
             one rank's parse and nodes need, whatever the number of ranks), MiB;
  analyze  — the whole `analyze` (parse again, rebuild, calibrate), wall s;
  per rank — one rank's trace parsed alone in a fresh process, the streaming parser against the
             whole-document one (`read_json` + `parse_trace`): peak RSS above the process's
             baseline, MiB, and wall s.
Then the time 128 ranks × 50 MB would take on 16 cores at the measured per-core rate (of the
largest trace), for 50 MB of JSON and for 50 MB of gzip (at the measured compression ratio).

    .venv/bin/python benchmarks/bench_analysis_scale.py            # 2/4/8 ranks, 40 and 160 steps
    .venv/bin/python benchmarks/bench_analysis_scale.py --quick    # 2 ranks, 8 and 24 steps
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from cli_steps import sh  # noqa: E402

TARGET_RANKS, TARGET_MB, TARGET_CORES = 128, 50.0, 16


def _cpu_s() -> float:
    """CPU seconds of this process and of its reaped children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _json_mib(path: Path) -> float:
    """Uncompressed size of a trace, MiB."""
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += len(chunk)
    return n / 2**20


def measure_profile(d: Path, workers: int | None) -> dict[str, Any]:
    """In a fresh process: parse `d` (no cache) with `workers`, then analyze it whole."""
    from sparselift.analysis.pipeline import analyze
    from sparselift.analysis.profile import load_profile

    cpu0 = _cpu_s()
    prof = load_profile(d, cache=False, workers=workers)
    cpu = _cpu_s() - cpu0
    st = prof.parse
    assert st is not None
    del prof
    t0 = time.perf_counter()
    analyze(d, cache=False, workers=workers)
    return {
        "workers": st.workers,
        "parse_s": st.wall_s,
        "cpu_s": cpu,
        "peak_mib": st.peak_rss_mib,
        "worker_peak_mib": st.worker_peak_rss_mib,
        "analyze_s": time.perf_counter() - t0,
    }


def measure_rank(path: Path, mode: str) -> dict[str, Any]:
    """In a fresh process: one trace parsed by the streaming (`new`) or whole-document parser."""
    from sparselift.analysis.trace import parse_trace, parse_trace_file, read_json

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    tr = parse_trace_file(path) if mode == "new" else parse_trace(read_json(path), str(path))
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"events": len(tr.events), "wall_s": wall, "peak_above_base_mib": peak - base}


def _fresh(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(HERE), *args], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def make_profile(root: Path, nproc: int, steps: int) -> Path:
    """A real profile of `tiny` at `nproc` ranks, `steps` profiled steps (made once per root)."""
    d = root / f"tiny_{nproc}r_{steps}s"
    if not (d / "manifest.json").is_file():
        sh(
            "profile",
            *("--workload", "tiny", "--nproc", str(nproc), "--steps", str(steps)),
            *("--after", "0", "--steady-steps", "0", "--out", str(d), "--force"),
            log=sys.stderr,
        )
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 ranks, 8 and 24 steps")
    ap.add_argument("--root", default=None, help="keep the profiles here (default: a temp dir)")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-trace", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="new", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure_profile(Path(args.measure), args.workers)))
        return
    if args.rank_trace:
        print(json.dumps(measure_rank(Path(args.rank_trace), args.mode)))
        return
    sizes = [(2, 8), (2, 24)] if args.quick else [(2, 8), (4, 8), (8, 8), (2, 40), (2, 160)]
    root = Path(args.root or tempfile.mkdtemp(prefix="sparselift-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    print(f"host: {cores} cores; profiles in {root}")
    head = (
        f"{'ranks':>5} {'steps':>5} {'gz MiB':>7} {'JSON MiB':>8} {'workers':>7} {'parse s':>7} "
        f"{'MB/s/core':>9} {'CPU s':>6} {'MB/CPU-s':>8} {'peak MiB':>8} {'per-rank MiB':>12} "
        f"{'1-worker s':>10} {'analyze s':>9}"
    )
    print(head)
    rows = []
    for nproc, steps in sizes:
        d = make_profile(root, nproc, steps)
        traces = sorted(d.glob("rank*.trace.json.gz"))
        gz = sum(p.stat().st_size for p in traces) / 2**20
        js = sum(_json_mib(p) for p in traces)
        par = _fresh("--measure", str(d))
        one = _fresh("--measure", str(d), "--workers", "1")
        rate = js / par["parse_s"] / par["workers"]
        wpk = par["worker_peak_mib"]
        print(
            f"{nproc:>5} {steps:>5} {gz:>7.2f} {js:>8.1f} {par['workers']:>7} "
            f"{par['parse_s']:>7.2f} {rate:>9.2f} {par['cpu_s']:>6.1f} {js / par['cpu_s']:>8.2f} "
            f"{par['peak_mib']:>8.0f} {(f'{wpk:.0f}' if wpk else '-'):>12} "
            f"{one['parse_s']:>10.2f} {par['analyze_s']:>9.2f}",
            flush=True,
        )
        rows.append(
            {
                "nproc": nproc,
                "steps": steps,
                "traces": traces,
                "gz": gz,
                "js": js,
                "rate": rate,
                "cpu_rate": js / par["cpu_s"],
                "serial_s_per_mb": max(par["analyze_s"] - par["parse_s"], 0.0) / js,
            }
        )
    big = max(rows, key=lambda r: r["js"] / r["nproc"])
    rank0 = big["traces"][0]
    print(
        f"\none rank's trace ({rank0.parent.name}/{rank0.name}, "
        f"{_json_mib(rank0):.1f} MiB JSON), parsed alone in a fresh process:"
    )
    for mode, what in (
        ("old", "whole document (read_json + parse_trace)"),
        ("new", "streaming (parse_trace_file)"),
    ):
        r = _fresh("--rank-trace", str(rank0), "--mode", mode)
        print(
            f"  {what:<42} {r['wall_s']:6.2f} s  peak +{r['peak_above_base_mib']:.0f} MiB "
            f"({r['events']} events)"
        )
    total = TARGET_RANKS * TARGET_MB
    ratio = big["js"] / big["gz"]
    print(
        f"\nextrapolated to {TARGET_RANKS} ranks x {TARGET_MB:.0f} MB on {TARGET_CORES} cores "
        f"(rates of {big['nproc']} ranks x {big['steps']} steps; target 600 s):"
    )
    for label, rate in (("wall", big["rate"]), ("CPU", big["cpu_rate"])):
        t = total / (rate * TARGET_CORES)
        print(
            f"  parse + per-rank nodes at {rate:.2f} MB/s/core ({label}): {t:.0f} s for 50 MB "
            f"of JSON a rank, {t * ratio:.0f} s for 50 MB of gzip (x{ratio:.1f} JSON)"
        )
    serial = big["serial_s_per_mb"] * total
    print(
        f"  the rest of analyze (one process, {big['serial_s_per_mb']:.3f} s/MB): {serial:.0f} s "
        f"for 50 MB of JSON a rank, {serial * ratio:.0f} s for 50 MB of gzip"
    )


if __name__ == "__main__":
    main()
