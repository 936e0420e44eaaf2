"""Analysis at scale: CPU-seconds per MB of trace JSON in the workers and in the analysing process,
and peak memory, as ranks and trace size grow.

Profiles `tiny` for real (`sparselift profile`) at 2, 4 and 8 ranks, and at 2 ranks with more
profiled steps so that each rank's trace reaches the size of a GPU rank's (tens of MB of JSON).
Each profile is then analysed (`analyze`, no cache) in a fresh process, so the figures are that
process's and its workers':
  per rank — each rank's trace parsed and its share of the analysis made in a worker
             (`rankwork.load_ranks`, default workers: one per core, at most one per rank): wall s,
             MB/s/core (= MB ÷ wall ÷ workers), CPU s of the workers, MB per worker CPU-second;
  merge    — what the analysing process does after the workers (pairing collectives across
             ranks, imbalance, critical path, evidence, calibration: `pipeline.merge_ranks`):
             CPU s and CPU ms per MB; and its CPU while the workers ran (receiving results);
  memory   — peak RSS of the analysing process, and of the largest worker, MiB;
  1 worker — the whole `analyze` in one process, wall s.
Then one rank's trace parsed alone in a fresh process, the streaming parser against the
whole-document one (`read_json` + `parse_trace`): peak RSS above the process's baseline and wall.
Then the merge at the target's number of ranks, measured, not extrapolated: the per-rank results
of the profile with the largest traces, cloned to 128 ranks (each clone renumbered) and merged in
a fresh process: CPU s and its peak RSS. Last, the time 128 ranks × 50 MB would take on 16 cores:
the per-rank work at the measured worker rate, plus that merge scaled to 50 MB a rank, for 50 MB
of JSON and for 50 MB of gzip (at the measured compression ratio).

    .venv/bin/python benchmarks/bench_analysis_scale.py            # 2/4/8 ranks, 40 and 160 steps
    .venv/bin/python benchmarks/bench_analysis_scale.py --quick    # 2 ranks, 8 and 24 steps
    .venv/bin/python benchmarks/bench_analysis_scale.py --sizes 2x8,8x8,2x160 --root DIR
"""

from __future__ import annotations

import argparse
import dataclasses
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
FULL = "2x8,4x8,8x8,2x40,2x160"
QUICK = "2x8,2x24"


def _cpu(who: int) -> float:
    """CPU seconds of this process (RUSAGE_SELF) or of its reaped children (RUSAGE_CHILDREN)."""
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _json_mib(path: Path) -> float:
    """Uncompressed size of a trace, MiB."""
    n = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            n += len(chunk)
    return n / 2**20


def measure_profile(d: Path, workers: int | None) -> dict[str, Any]:
    """In a fresh process: `analyze(d)` (no cache) with `workers`, split where the workers end
    (the progress line that reports them)."""
    from sparselift.analysis.pipeline import analyze

    mark: dict[str, float] = {}

    def progress(line: str) -> None:
        if line.startswith("parsed "):  # the workers are done and reaped
            mark.update(
                t=time.perf_counter(),
                self=_cpu(resource.RUSAGE_SELF),
                kids=_cpu(resource.RUSAGE_CHILDREN),
                workers=float(line.split(" with ")[1].split()[0]),
            )

    t0, self0 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
    analyze(d, cache=False, workers=workers, progress=progress)
    t1, self1 = time.perf_counter(), _cpu(resource.RUSAGE_SELF)
    one = mark["workers"] == 1  # the per-rank work ran here
    return {
        "workers": int(mark["workers"]),
        "ranks_s": mark["t"] - t0,
        "worker_cpu_s": (mark["self"] - self0) if one else mark["kids"],
        "main_ranks_cpu_s": 0.0 if one else mark["self"] - self0,
        "merge_cpu_s": self1 - mark["self"],
        "merge_s": t1 - mark["t"],
        "analyze_s": t1 - t0,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "worker_peak_mib": None
        if one
        else resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def clone_ranks(run: Any, n: int) -> Any:
    """`run` (a `rankwork.RankedProfile`) as if it had `n` ranks: rank r is a copy of rank
    r mod (its ranks), renumbered, with the manifest's world size set to n."""
    from sparselift.analysis.rankwork import RankResult, RankShare
    from sparselift.analysis.reconstruct import RankGraph

    results = []
    for r in range(n):
        src = run.results[r % len(run.results)]
        s, g = src.share, src.share.graph
        graph = RankGraph(r, g.nodes.assign(rank=r), g.edges, g.steps.assign(rank=r), [])
        share = RankShare(graph, s.summary.assign(rank=r), s.critical.assign(rank=r))
        results.append(
            RankResult(f"{src.path}#{r}", r, r, n, src.span, share, src.calls.assign(rank=r))
        )
    files = dataclasses.replace(
        run.files, manifest={**run.files.manifest, "world_size": n}, ranks=list(range(n))
    )
    return dataclasses.replace(run, files=files, results=results)


def measure_merge(d: Path, n: int) -> dict[str, Any]:
    """In a fresh process: `d`'s per-rank results cloned to `n` ranks, then merged."""
    from sparselift.analysis.pipeline import merge_ranks
    from sparselift.analysis.rankwork import load_ranks

    run = clone_ranks(load_ranks(d, cache=False), n)
    c0, t0 = _cpu(resource.RUSAGE_SELF), time.perf_counter()
    a = merge_ranks(run, d)
    return {
        "cpu_s": _cpu(resource.RUSAGE_SELF) - c0,
        "wall_s": time.perf_counter() - t0,
        "nodes": len(a.nodes),
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
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


def _sizes(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(r), int(s)) for r, s in (x.split("x") for x in text.split(","))]
    except ValueError:
        raise SystemExit(f"--sizes: expected RANKSxSTEPS,..., got {text!r}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"--sizes {QUICK}")
    ap.add_argument("--sizes", default=None, help=f"profiles RANKSxSTEPS,... (default {FULL})")
    ap.add_argument("--root", default=None, help="keep the profiles here (default: a temp dir)")
    ap.add_argument("--merge-ranks", type=int, default=TARGET_RANKS, help="ranks to clone to")
    ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--merge", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank-trace", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="new", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure_profile(Path(args.measure), args.workers)))
        return
    if args.merge:
        print(json.dumps(measure_merge(Path(args.merge), args.merge_ranks)))
        return
    if args.rank_trace:
        print(json.dumps(measure_rank(Path(args.rank_trace), args.mode)))
        return
    sizes = _sizes(args.sizes or (QUICK if args.quick else FULL))
    root = Path(args.root or tempfile.mkdtemp(prefix="sparselift-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"host: {os.cpu_count() or 1} cores; profiles in {root}")
    print(
        f"{'ranks':>5} {'steps':>5} {'gz MiB':>7} {'JSON MiB':>8} {'workers':>7} "
        f"{'rank s':>6} {'MB/s/core':>9} {'wkr CPU s':>9} {'MB/CPU-s':>8} "
        f"{'main CPU s':>10} {'merge CPU s':>11} {'ms/MB':>6} {'peak MiB':>8} "
        f"{'wkr MiB':>7} {'1-worker s':>10} {'analyze s':>9}"
    )
    rows = []
    for nproc, steps in sizes:
        d = make_profile(root, nproc, steps)
        traces = sorted(d.glob("rank*.trace.json.gz"))
        gz = sum(p.stat().st_size for p in traces) / 2**20
        js = sum(_json_mib(p) for p in traces)
        par = _fresh("--measure", str(d))
        one = _fresh("--measure", str(d), "--workers", "1")
        wpk = par["worker_peak_mib"]
        print(
            f"{nproc:>5} {steps:>5} {gz:>7.2f} {js:>8.1f} {par['workers']:>7} "
            f"{par['ranks_s']:>6.2f} {js / par['ranks_s'] / par['workers']:>9.2f} "
            f"{par['worker_cpu_s']:>9.1f} {js / par['worker_cpu_s']:>8.2f} "
            f"{par['main_ranks_cpu_s']:>10.2f} {par['merge_cpu_s']:>11.2f} "
            f"{1e3 * par['merge_cpu_s'] / js:>6.1f} {par['peak_mib']:>8.0f} "
            f"{(f'{wpk:.0f}' if wpk else '-'):>7} {one['analyze_s']:>10.2f} "
            f"{par['analyze_s']:>9.2f}",
            flush=True,
        )
        rows.append(
            {
                "nproc": nproc,
                "steps": steps,
                "dir": d,
                "traces": traces,
                "gz": gz,
                "js": js,
                "cpu_rate": js / par["worker_cpu_s"],
                "main_rate": par["main_ranks_cpu_s"] / js,
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
    n = args.merge_ranks
    per_rank_mb = big["js"] / big["nproc"]
    mg = _fresh("--merge", str(big["dir"]), "--merge-ranks", str(n))
    print(
        f"\nmerge of {n} ranks ({big['dir'].name}'s per-rank results cloned, {per_rank_mb:.1f} "
        f"MiB JSON a rank, {n * per_rank_mb:.0f} MiB in all, {mg['nodes']} nodes), fresh "
        f"process: {mg['cpu_s']:.2f} CPU s ({mg['wall_s']:.2f} s wall), "
        f"{1e3 * mg['cpu_s'] / (n * per_rank_mb):.2f} ms/MB; peak RSS {mg['peak_mib']:.0f} MiB"
    )
    total = TARGET_RANKS * TARGET_MB
    ratio = big["js"] / big["gz"]
    per_rank_t = total / (big["cpu_rate"] * TARGET_CORES)
    merge_t = mg["cpu_s"] * (TARGET_MB / per_rank_mb) * (TARGET_RANKS / n)
    recv_t = big["main_rate"] * total
    print(
        f"\nextrapolated to {TARGET_RANKS} ranks x {TARGET_MB:.0f} MB on {TARGET_CORES} cores "
        f"(rates of {big['nproc']} ranks x {big['steps']} steps; target 600 s):"
    )
    print(
        f"  per-rank work at {big['cpu_rate']:.2f} MB/CPU-s (workers): {per_rank_t:.0f} s for "
        f"50 MB of JSON a rank, {per_rank_t * ratio:.0f} s for 50 MB of gzip (x{ratio:.1f} JSON)"
    )
    print(
        f"  the analysing process: merge {merge_t:.0f} s (measured at {n} ranks, scaled to 50 MB "
        f"a rank), receiving results {recv_t:.0f} s; at 50 MB of gzip "
        f"{(merge_t + recv_t) * ratio:.0f} s"
    )
    print(
        f"  whole analysis: {per_rank_t + merge_t + recv_t:.0f} s for 50 MB of JSON a rank, "
        f"{(per_rank_t + merge_t + recv_t) * ratio:.0f} s for 50 MB of gzip"
    )


if __name__ == "__main__":
    main()
