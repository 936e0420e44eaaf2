"""Judged by TorchRec's own storage estimate: does every SparseLift plan fit?

A seeded what-if corpus (`synthetic.whatif_corpus`, shared with bench_whatif_corpus.py: per
workload 20–300 tables of `synthetic_stats`, rows log-uniform in 10³–4·10⁷ — a power law —, dims
32–256, poolings 1–60, a batch of 512–8192 per rank) is planned
by `optimize` on h100x8 hosts at 8, 64 and 128 ranks, and every plan is scored by
`torchrec_referee.storage_verdicts`: TorchRec's EmbeddingStorageEstimator on the plan's shards,
every rank against the budget TorchRec's planner leaves it (`HeuristicalStorageReservation(0.15)`).
Target: every plan fits. Also checked, rank by rank: SparseLift's own memory figure is at least
TorchRec's (the model is the more conservative). Workloads the optimizer refuses (the tables do not
fit even with UVM caching) ship no plan and are counted apart.

    .venv/bin/python benchmarks/bench_optimizer_storage.py            # 50 workloads × 3 sizes
    .venv/bin/python benchmarks/bench_optimizer_storage.py --quick    # 3 small workloads, 8/64
"""

from __future__ import annotations

import json
import time

from corpus_args import corpus_parser, parse_corpus_args

from sparselift.errors import UserError
from sparselift.optimizer.coefficients import coefficients
from sparselift.optimizer.cost_model import CostModel
from sparselift.optimizer.optimize import Inputs, optimize
from sparselift.optimizer.problem import Problem
from sparselift.optimizer.space import PlanWide
from sparselift.optimizer.synthetic import synthetic_stats, whatif_corpus
from sparselift.optimizer.topology import preset
from sparselift.optimizer.torchrec_referee import storage_verdicts
from sparselift.optimizer.torchrec_storage import hbm_budget

GB = 1e9


def budget_hooked() -> bool:
    """Whether the optimizer plans to `hbm_budget` (TorchRec's reservation), not usable HBM."""
    topo = preset("h100x8", 8)
    stats = synthetic_stats(4, seed=0)
    model = CostModel(topo, 8192, coefficients(topo))
    cap = Problem(stats, model, PlanWide(), {s.name: [] for s in stats}).hbm_cap
    return cap == hbm_budget(topo, 8192, stats)


def main() -> None:
    ap = corpus_parser(__doc__.splitlines()[0], "3 workloads of 20–40 tables at 8/64")
    quick = dict(workloads=3, ranks=[8, 64], max_tables=40, time_limit=3.0)
    args = parse_corpus_args(ap, quick)
    print(f"optimizer plans to TorchRec's budget (hbm_budget): {budget_hooked()}")
    rows = []
    head = (
        f"{'seed':>4} {'ranks':>5} {'tables':>6} {'batch':>5}  {'busiest':>9} {'budget':>9} "
        f"{'used':>6}  fits  model≥TR  {'s':>5}"
    )
    print(head)
    for w in whatif_corpus(args.workloads, args.min_tables, args.max_tables):
        for world in args.ranks:
            topo = preset("h100x8", world)
            t0 = time.perf_counter()
            row: dict = dict(seed=w.seed, ranks=world, tables=len(w.stats), batch=w.batch_size)
            try:
                res = optimize(
                    Inputs(w.stats, topo, w.batch_size, coefficients(topo)),
                    time_limit_s=args.time_limit,
                )
            except UserError as e:
                row.update(status="refused", why=str(e)[:120], s=time.perf_counter() - t0)
                rows.append(row)
                where = f"{w.seed:>4} {world:>5} {len(w.stats):>6} {w.batch_size:>5}"
                print(f"{where}  refused: {row['why'][:70]}")
                continue
            (v,) = storage_verdicts([res.plan], w.stats, topo, w.batch_size)
            busiest = max(v.hbm_per_rank)
            conservative = all(
                r.hbm_bytes >= tr for r, tr in zip(res.cost.per_rank, v.hbm_per_rank, strict=True)
            )
            row.update(
                status="fits" if v.fits else "OOM",
                busiest_gb=busiest / GB,
                budget_gb=v.hbm_budget / GB,
                used=busiest / max(1, v.hbm_budget),
                model_at_least_torchrec=conservative,
                kept_torchrec=res.kept_baseline,
                s=time.perf_counter() - t0,
            )
            rows.append(row)
            print(
                f"{w.seed:>4} {world:>5} {len(w.stats):>6} {w.batch_size:>5}  "
                f"{busiest / GB:>7.2f}GB {v.hbm_budget / GB:>7.2f}GB {row['used']:>6.1%}  "
                f"{'yes ' if v.fits else 'NO  '}  {'yes' if conservative else 'NO ':<8}  "
                f"{row['s']:>5.1f}",
                flush=True,
            )
    planned = [r for r in rows if r["status"] != "refused"]
    fits = sum(r["status"] == "fits" for r in planned)
    cons = sum(r["model_at_least_torchrec"] for r in planned)
    print(
        f"\nplans that fit TorchRec's storage estimate: {fits}/{len(planned)} "
        f"(refused, no plan: {len(rows) - len(planned)}); "
        f"SparseLift's memory ≥ TorchRec's on every rank: {cons}/{len(planned)}"
    )
    worst = sorted(planned, key=lambda r: -r["used"])[:5]
    print("fullest 5 (busiest rank ÷ TorchRec's budget):")
    for r in worst:
        print(
            f"  seed {r['seed']} at {r['ranks']} ranks ({r['tables']} tables, batch {r['batch']}): "
            f"{r['busiest_gb']:.2f} of {r['budget_gb']:.2f} GB ({r['used']:.1%})"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
