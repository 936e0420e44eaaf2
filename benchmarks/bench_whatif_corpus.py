"""Judged by TorchRec's own estimator on a randomized what-if corpus: is SparseLift's plan ever
worse than TorchRec's best plan, and how much better is it on the geometric mean?

The corpus is `synthetic.whatif_corpus` (the one bench_optimizer_storage.py checks storage on): per
seeded workload 20–300 tables, rows log-uniform (a power law) in 10³–4·10⁷, dims 32–256, poolings
1–60, a batch of 512–8192 per rank. Each workload is planned for 8, 64 and 128 ranks of h100x8
with no profile (every coefficient assumed: what-if planning, `optimizer.whatif`).

- TorchRec's best plan: `torchrec_best_plan`, TorchRec's planner given the statistics with its
  UniformProposer first, then its default proposers until its own limit (--torchrec-timeout s
  after its enumeration): its default proposers' plan where they finish, the uniform one where
  they time out. Cached in --cache (keyed by every input), since it takes minutes at 128 ranks.
- SparseLift's plan: `optimize` given that plan (the warm start and the plan to beat, as
  `sparselift optimize` gets it) and --time-limit.
- `ratio`: TorchRec's EmbeddingPerfEstimator (`torchrec_referee.torchrec_cost`, NoopPerfModel.rate)
  on TorchRec's plan at SparseLift's comm precision ÷ on SparseLift's plan: equal precision, so
  the ratio is what the sharding is worth. `SL ratio`: the same by SparseLift's model.
- `fits`: TorchRec's storage estimate of SparseLift's plan within its planner's budget per rank.

Targets: ratio ≥ 1 for every plan, geomean ≥ 1.25, every plan fits. The worst 5 are printed with
why: what `optimize` decided (kept TorchRec's plan, tables set back where the models disagree)
and how close TorchRec's plan already is to the lowest verdict TorchRec's estimator allows (its
largest unavoidable shard, or the average rank's load).

    .venv/bin/python benchmarks/bench_whatif_corpus.py            # 50 workloads × 8/64/128 ranks
    .venv/bin/python benchmarks/bench_whatif_corpus.py --quick    # 4 small workloads at 8/64
    .venv/bin/python benchmarks/bench_whatif_corpus.py --first-seed 50 --workloads 10 --ranks 16 32
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from corpus_args import corpus_parser, parse_corpus_args

from sparselift import plans
from sparselift.atomic import write_bytes
from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.feasibility import feasible_classes
from sparselift.optimizer.optimize import Inputs, Result, optimize
from sparselift.optimizer.robust import without_uvm
from sparselift.optimizer.space import PlanWide
from sparselift.optimizer.synthetic import Workload, whatif_corpus
from sparselift.optimizer.topology import Topology, preset
from sparselift.optimizer.torchrec_baseline import torchrec_best_plan
from sparselift.optimizer.torchrec_prices import TorchRecPrices
from sparselift.optimizer.torchrec_referee import storage_verdicts, torchrec_cost

DEVICE = "h100x8"


def torchrec_plan(
    w: Workload, topo: Topology, timeout_s: float, cache: Path | None
) -> tuple[plans.Plan | None, float, str]:
    """TorchRec's best plan for workload `w` on `topo` (from the cache where it was made with
    the same inputs): (plan or None, seconds it took, "ok" / "cached" / the planner's refusal)."""
    import torchrec

    key = hashlib.sha256(
        repr(
            (w.stats, w.batch_size, topo, timeout_s, torchrec.__version__, "uniform+default")
        ).encode()
    ).hexdigest()[:20]
    path = cache / f"torchrec-{w.seed}-{topo.world_size}-{key}.json" if cache else None
    if path is not None and path.exists():
        d = json.loads(path.read_text())
        plan = plans.Plan.from_dict(d["plan"]) if d["plan"] else None
        return plan, d["seconds"], "cached" if plan else d["status"]
    t0 = time.perf_counter()
    try:
        plan, status = torchrec_best_plan(w.stats, topo, w.batch_size, int(timeout_s)), "ok"
    except plans.PlanError as e:
        plan, status = None, f"refused: {e}"
    secs = time.perf_counter() - t0
    if path is not None:
        d = {"plan": plan.to_dict() if plan else None, "seconds": secs, "status": status}
        write_bytes(path, json.dumps(d).encode())
    return plan, secs, status


def lower_bound_ms(w: Workload, topo: Topology, precision: plans.CommPrecision) -> float:
    """The lowest verdict TorchRec's estimator allows any plan of these tables (ms): the larger
    of the largest shard no choice avoids (each table's smallest largest shard, over the
    classes that fit) and the average rank's load (each table's least total over the ranks)."""
    model = CostModel(topo, w.batch_size, coefficients(topo))
    wide = PlanWide(precision.forward, precision.backward)
    classes = feasible_classes(model, w.stats, wide)
    classes = without_uvm(classes) or classes
    prices = TorchRecPrices(w.stats, topo, w.batch_size, precision)
    prices.price((n, c) for n, cs in classes.items() for c in cs)
    single = max(min(max(prices.shards(n, c)) for c in cs) for n, cs in classes.items())
    mean = sum(min(sum(prices.shards(n, c)) for c in cs) for n, cs in classes.items())
    return max(single, mean / topo.world_size) * 1e3


def why(res: Result) -> str:
    """What `optimize` decided where the two models disagreed, from its notes."""
    said = [n for n in res.notes if "set back" in n or "kept TorchRec" in n or "again" in n]
    if res.kept_baseline:
        said.append("TorchRec's plan kept")
    return "; ".join(said) or "both models accepted the plan as solved"


def run_one(w: Workload, world: int, args: argparse.Namespace, cache: Path | None) -> dict:
    """Plan workload `w` at `world` ranks both ways and score both plans (one row)."""
    topo = preset(DEVICE, world)
    row: dict[str, Any] = dict(seed=w.seed, ranks=world, tables=len(w.stats), batch=w.batch_size)
    base, tr_s, status = torchrec_plan(w, topo, args.torchrec_timeout, cache)
    row.update(torchrec_s=tr_s, torchrec_status=status)
    if base is None:
        row["status"] = "no torchrec plan"
        return row
    t0 = time.perf_counter()
    try:
        res = optimize(
            Inputs(w.stats, topo, w.batch_size, coefficients(topo)),
            time_limit_s=args.time_limit,
            baseline=base,
        )
    except UserError as e:
        row.update(status="refused", why=str(e)[:120])
        return row
    row["ours_s"] = time.perf_counter() - t0
    cp = res.plan.comm_precision
    same = dataclasses.replace(base, comm_precision=cp)
    ours_v, theirs_v = torchrec_cost([res.plan, same], w.stats, topo, w.batch_size)
    (storage,) = storage_verdicts([res.plan], w.stats, topo, w.batch_size)
    v = res.verdicts
    row.update(
        status="planned",
        precision=f"{cp.forward}/{cp.backward}",
        torchrec_est_ms=theirs_v.rate_ms,
        ours_est_ms=ours_v.rate_ms,
        ratio=theirs_v.rate_ms / ours_v.rate_ms,
        sl_ratio=v.base_sparselift_s / v.ours_sparselift_s if v else None,
        fits=storage.fits,
        kept=res.kept_baseline,
        why=why(res),
        notes=res.notes,
    )
    return row


def geomean(xs: list[float]) -> float:
    """The geometric mean (nan for none)."""
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def report(rows: list[dict], args: argparse.Namespace, corpus: list[Workload]) -> None:
    """The summary: ratios against the targets, storage, planning times, the worst 5 and why."""
    done = [r for r in rows if r["status"] == "planned"]
    ratios = [r["ratio"] for r in done]
    worse = [r for r in done if r["ratio"] < 1 - 1e-9]
    g = geomean(ratios)
    missing = [f"{r['seed']}@{r['ranks']} {r['status']}" for r in rows if r not in done]
    print(
        f"\n{len(done)} plans"
        + (f" ({len(missing)} without: {', '.join(missing)})" if missing else "")
        + f": TorchRec's estimator rates SparseLift's plan {g:.3f}× faster on the geomean "
        f"(target ≥ 1.25: {'met' if g >= 1.25 else 'MISSED'}), min {min(ratios):.3f}×, "
        f"worse than TorchRec's in {len(worse)} (target 0)"
    )
    for world in args.ranks:
        at = [r["ratio"] for r in done if r["ranks"] == world]
        if at:
            print(
                f"  {world:>3} ranks: geomean {geomean(at):.3f}×, min {min(at):.3f}×, n={len(at)}"
            )
    sl = [r["sl_ratio"] for r in done if r["sl_ratio"]]
    if sl:
        print(f"SparseLift's model: geomean {geomean(sl):.3f}×, min {min(sl):.3f}×")
    fits = sum(r["fits"] for r in done)
    print(f"plans that fit TorchRec's storage estimate: {fits}/{len(done)}")
    kept = sum(r["kept"] for r in done)
    print(f"TorchRec's plan kept (the models found no plan both accept): {kept}/{len(done)}")
    secs = [r["ours_s"] for r in done]
    print(
        f"planning time (optimize, --time-limit {args.time_limit:g}): median "
        f"{statistics.median(secs):.1f} s, max {max(secs):.1f} s; TorchRec's planner (made now, "
        "not cached): "
        + (
            f"median {statistics.median(t):.1f} s, max {max(t):.1f} s"
            if (t := [r["torchrec_s"] for r in rows if r["torchrec_status"] == "ok"])
            else "all cached"
        )
    )
    print("worst 5 (TorchRec's estimator: TorchRec's plan ÷ SparseLift's) and why:")
    for r in sorted(done, key=lambda r: (r["ratio"], r["seed"], r["ranks"]))[:5]:
        topo = preset(DEVICE, r["ranks"])
        w = corpus[r["seed"]]  # a workload's seed is its index in the corpus
        fwd, bwd = r["precision"].split("/")
        bound = lower_bound_ms(w, topo, plans.CommPrecision(forward=fwd, backward=bwd))
        print(
            f"  seed {r['seed']} at {r['ranks']} ranks ({r['tables']} tables, batch {r['batch']}, "
            f"{r['precision']}): {r['ratio']:.3f}× (SparseLift's model {r['sl_ratio'] or 0:.3f}×); "
            f"TorchRec's plan {r['torchrec_est_ms']:.3f} ms is {r['torchrec_est_ms'] / bound:.2f}× "
            f"the lowest its estimator allows ({bound:.3f} ms); {r['why']}"
        )


def main() -> None:
    ap = corpus_parser(
        __doc__.splitlines()[0],
        "4 workloads of 20–40 tables at 8/64",
        time_limit_help="SparseLift's solver limit",
    )
    ap.add_argument(
        "--first-seed", type=int, default=0, help="skip the corpus's first workloads (held out)"
    )
    ap.add_argument(
        "--torchrec-timeout", type=float, default=20.0, help="TorchRec's own proposing limit"
    )
    ap.add_argument("--cache", default="runs/bench_whatif_torchrec", help="'' for none")
    quick = dict(workloads=4, ranks=[8, 64], max_tables=40, time_limit=3.0, torchrec_timeout=5.0)
    args = parse_corpus_args(ap, quick)
    cache = Path(args.cache) if args.cache else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    corpus = whatif_corpus(args.first_seed + args.workloads, args.min_tables, args.max_tables)
    print(
        f"{'seed':>4} {'ranks':>5} {'tables':>6} {'batch':>5} {'TR s':>6} {'ours s':>6} "
        f"{'prec.':>9} {'TR plan':>9} {'ours':>9} {'ratio':>6} {'SL ratio':>8} fits  decided"
    )
    rows = []
    for w in corpus[args.first_seed :]:
        for world in args.ranks:
            r = run_one(w, world, args, cache)
            rows.append(r)
            head = (
                f"{r['seed']:>4} {world:>5} {r['tables']:>6} {r['batch']:>5} "
                f"{r['torchrec_s']:>6.1f}"
            )
            if r["status"] != "planned":
                print(f"{head}  {r['status']} {r.get('why', r['torchrec_status'])}", flush=True)
                continue
            print(
                f"{head} {r['ours_s']:>6.1f} {r['precision']:>9} {r['torchrec_est_ms']:>7.3f}ms "
                f"{r['ours_est_ms']:>7.3f}ms {r['ratio']:>6.3f} {r['sl_ratio'] or 0:>8.3f} "
                f"{'yes ' if r['fits'] else 'NO  '}  {'kept' if r['kept'] else r['why'][:40]}",
                flush=True,
            )
    report(rows, args, corpus)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
