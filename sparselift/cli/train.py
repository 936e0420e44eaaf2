"""`sparselift train` and `sparselift workloads`; the training flags train, profile, bench share."""

from __future__ import annotations

import argparse
from typing import Any

from sparselift.workloads.harness import DEVICES, PIPELINES, TrainConfig


def add_training_args(p: argparse.ArgumentParser) -> None:
    """Add the flags every command that trains shares (train, profile, bench) to `p`."""
    p.add_argument(
        "--workload",
        required=True,
        help="built-in name (tiny, criteo-kaggle, multihot-26) or a spec path "
        "(format: `sparselift workloads --format`)",
    )
    p.add_argument("--nproc", type=int, default=2, help="ranks to launch on this host (default 2)")
    add_node_args(p)
    p.add_argument("--steps", type=int, default=30, help="measured steps (default %(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="steps before measuring (default 5)")
    p.add_argument(
        "--max-rows", type=int, default=None, help="hash ids into at most this many rows per table"
    )
    p.add_argument(
        "--batch-size", type=int, default=None, help="samples per rank (default: the workload's)"
    )
    p.add_argument(
        "--pipeline",
        choices=PIPELINES,
        default=None,
        help="train pipeline (default: the plan's, else base)",
    )
    p.add_argument(
        "--data", default=None, help="directory of TorchRec-preprocessed Criteo .npy day files"
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seeds the model and the batches (0..4294967295)"
    )
    p.add_argument("--device", choices=DEVICES, default="auto")


def add_node_args(p: argparse.ArgumentParser) -> None:
    """torchrun's multi-node flags: every host runs the same command with its --node-rank."""
    from sparselift.workloads.launch import DEFAULT_RDZV_TIMEOUT_S

    g = p.add_argument_group("several hosts (as torchrun; unneeded under torchrun or srun)")
    g.add_argument("--nnodes", type=int, default=1, help="hosts, --nproc ranks each (default 1)")
    g.add_argument("--node-rank", type=int, default=0, help="this host's index (0: the first)")
    g.add_argument(
        "--rdzv-endpoint", default=None, metavar="HOST:PORT", help="node 0's rendezvous address"
    )
    g.add_argument("--rdzv-id", default=None, help="the job's id, the same on every host")
    g.add_argument(
        "--rdzv-timeout",
        type=int,
        default=DEFAULT_RDZV_TIMEOUT_S,
        metavar="S",
        help="seconds to wait for every host at the rendezvous (default %(default)s)",
    )


def config_from_args(
    args: argparse.Namespace, plan: str | None = None, **extra: Any
) -> TrainConfig:
    """The TrainConfig the shared training flags in `args` describe.

    Args:
        args: parsed flags of `add_training_args`.
        plan: the plan file to train with (None: TorchRec's planner).
        extra: further TrainConfig fields (hook, hook_args, progress).
    """
    return TrainConfig(
        workload=args.workload,
        nproc=args.nproc,
        steps=args.steps,
        warmup=args.warmup,
        max_rows=args.max_rows,
        batch_size=args.batch_size,
        pipeline=args.pipeline,
        data=args.data,
        seed=args.seed,
        device=args.device,
        plan=plan,
        nnodes=getattr(args, "nnodes", 1),
        node_rank=getattr(args, "node_rank", 0),
        rdzv_endpoint=getattr(args, "rdzv_endpoint", None),
        rdzv_id=getattr(args, "rdzv_id", None),
        rdzv_timeout_s=getattr(args, "rdzv_timeout", 120),
        **extra,
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add `train` and `workloads` to the `sparselift` sub-commands."""
    p = sub.add_parser("train", help="train a workload on N ranks with DistributedModelParallel")
    add_training_args(p)
    p.add_argument(
        "--plan", default=None, help="a SparseLift plan file (default: TorchRec's planner)"
    )
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    p.set_defaults(run=run_train)

    p = sub.add_parser("workloads", help="list the built-in workloads")
    p.add_argument(
        "--format",
        action="store_true",
        help="print the workload-spec format (docs/WORKLOADS.md) instead",
    )
    p.set_defaults(run=run_workloads)


def run_train(args: argparse.Namespace) -> int:
    """Train, print the result's summary (and write --json); 0 on success.

    Raises:
        UserError: bad input, refused before any rank starts (an unwritable --json included).
        RankFailed: a rank failed.
    """
    from sparselift.atomic import check_writable, write_json
    from sparselift.workloads.harness import run_training
    from sparselift.workloads.in_place import reports_here

    if args.json:
        check_writable(args.json)
    result = run_training(config_from_args(args, plan=args.plan, progress=True))
    if not reports_here():
        return 0
    print(result.summary())
    if args.json:
        write_json(args.json, result.to_json())
    return 0


def run_workloads(args: argparse.Namespace) -> int:
    """Print one line per built-in workload, or with --format the spec format; 0."""
    if args.format:
        from sparselift.workloads.spec_format import spec_format

        print(spec_format(), end="")
        return 0
    from sparselift.workloads.spec import builtin_names, load_workload

    for name in builtin_names():
        w = load_workload(name)
        rows = sum(t.num_embeddings for t in w.tables)
        print(
            f"{name:15s} {len(w.tables):3d} tables {rows:>12,d} rows  {w.model.arch:10s} "
            f"batch {w.batch_size}"
        )
    return 0
