"""`sparselift plan from-torchrec|round-robin`: write a reference plan for a workload.

CLI code, registered by `cli.plan`. Bad input raises UserError (one line, exit code 2) before
anything is written.
"""

from __future__ import annotations

import argparse
from typing import Any

from sparselift.plans.baselines import DEVICE_PRESETS
from sparselift.plans.types import MAX_WORLD_SIZE


def register(psub: argparse._SubParsersAction) -> None:
    """Add `from-torchrec` and `round-robin` to the `plan` actions."""
    q = psub.add_parser(
        "from-torchrec", help="export the plan TorchRec's EmbeddingShardingPlanner makes"
    )
    _add_topology_args(q)
    q.add_argument(
        "--batch-size", type=int, default=None, help="per rank (default: the workload's)"
    )
    q.set_defaults(run=run_from_torchrec, command="plan from-torchrec")

    q = psub.add_parser(
        "round-robin", help="write the DLRM reference plan: table i whole on rank i mod N"
    )
    _add_topology_args(q)
    q.set_defaults(run=run_round_robin, command="plan round-robin")


def _add_topology_args(q: argparse.ArgumentParser) -> None:
    q.add_argument("--workload", required=True)
    q.add_argument("--world-size", type=int, required=True)
    q.add_argument(
        "--local-world-size", type=int, default=None, help="ranks per host (default: world size)"
    )
    q.add_argument(
        "--device", default="cpu", help=f"device preset: {', '.join(DEVICE_PRESETS)} (default cpu)"
    )
    q.add_argument(
        "--max-rows", type=int, default=None, help="hash ids into at most this many rows per table"
    )
    q.add_argument("--out", required=True, help="plan file to write")


def check_world_size(flag: str, n: int) -> None:
    from sparselift.errors import UserError

    if not 1 <= n <= MAX_WORLD_SIZE:
        raise UserError(f"{flag} must be in 1..{MAX_WORLD_SIZE:,}, got {n:,}")


def _topology(args: argparse.Namespace) -> Any:
    """The PlanTopology of --world-size, --local-world-size and --device (UserError if bad)."""
    from sparselift.errors import UserError
    from sparselift.plans.types import PlanTopology

    if args.device not in DEVICE_PRESETS:
        raise UserError(
            f"unknown --device preset {args.device!r} (known: {', '.join(DEVICE_PRESETS)})"
        )
    check_world_size("--world-size", args.world_size)
    local = args.world_size if args.local_world_size is None else args.local_world_size
    if local < 1 or args.world_size % local:
        raise UserError(
            f"--world-size {args.world_size} must be a positive multiple of "
            f"--local-world-size {local}"
        )
    return PlanTopology(
        world_size=args.world_size,
        local_world_size=local,
        device=DEVICE_PRESETS[args.device]["device"],
        # the optimizer's preset that prices it: CPU has one; a bare cuda names no GPU model
        preset="cpu-gloo" if args.device == "cpu" else None,
    )


def _provenance(args: argparse.Namespace, how: str) -> dict[str, Any]:
    """What a written plan was made by and from: command, workload, row cap, versions."""
    import torch
    import torchrec

    import sparselift

    return {
        "made_by": how,
        "workload": args.workload,
        "max_rows": args.max_rows,
        "versions": {
            "sparselift": getattr(sparselift, "__version__", None),
            "torch": torch.__version__,
            "torchrec": getattr(torchrec, "__version__", None),
        },
    }


def _fingerprints(spec: Any, model: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The spec's tables as a plan's model fingerprint, each with its collection's path in
    `model` where the model has several collections: each runs its own collectives, which
    `plan show` and the reports count, and a plan that does not say which table is whose
    would count one collective pair per sharding type for all of them. Also the path of the
    model's one collection, where it has one (else None)."""
    from sparselift.plans.to_torchrec import model_tables

    path_of = {found.table.name: found.path for found in model_tables(model)}
    paths = set(path_of.values())
    tables = spec.fingerprints()
    if len(paths) > 1:
        return [{**t, "module": path_of[t["name"]]} for t in tables], None
    return tables, paths.pop() if paths else None


def run_from_torchrec(args: argparse.Namespace) -> int:
    """Write the plan TorchRec's planner makes for --workload on the topology; 0.

    Raises:
        UserError: bad input (refused before the planner runs), or PlanError: the planner
            found no plan.
    """
    import torch

    from sparselift.atomic import check_writable
    from sparselift.errors import UserError
    from sparselift.plans import from_torchrec, save, torchrec_plan
    from sparselift.workloads.models import build_model
    from sparselift.workloads.spec import MAX_BATCH_SIZE, load_workload

    topology = _topology(args)
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise UserError(f"--batch-size must be in 1..{MAX_BATCH_SIZE:,}, got {args.batch_size:,}")
    spec = load_workload(args.workload).capped(args.max_rows)
    check_writable(args.out)
    model = build_model(spec, dense_device=torch.device("cpu"))
    batch = args.batch_size or spec.batch_size
    plan = from_torchrec(
        torchrec_plan(model, topology, batch),
        _fingerprints(spec, model)[0],
        topology,
        provenance={**_provenance(args, "sparselift plan from-torchrec"), "batch_size": batch},
    )
    save(plan, args.out)
    print(
        f"wrote {args.out}: TorchRec's plan for {spec.name} on {topology.world_size} "
        f"{topology.device} ranks"
    )
    return 0


def run_round_robin(args: argparse.Namespace) -> int:
    """Write the round-robin table-wise reference plan for --workload; 0.

    Raises:
        UserError: bad input, refused before anything is written.
    """
    import torch

    from sparselift.atomic import check_writable
    from sparselift.plans import round_robin_table_wise, save
    from sparselift.workloads.models import build_model
    from sparselift.workloads.spec import load_workload

    topology = _topology(args)
    spec = load_workload(args.workload).capped(args.max_rows)
    check_writable(args.out)
    model = build_model(spec, dense_device=torch.device("cpu"))
    tables, module = _fingerprints(spec, model)
    plan = round_robin_table_wise(
        tables,
        topology,
        module=module,
        provenance=_provenance(args, "sparselift plan round-robin"),
    )
    save(plan, args.out)
    print(
        f"wrote {args.out}: round-robin table-wise plan for {spec.name} on "
        f"{topology.world_size} ranks"
    )
    return 0
