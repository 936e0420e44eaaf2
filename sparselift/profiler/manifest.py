"""manifest.json of a profile directory: what ran, so later stages never have to guess.

Format "sparselift-profile", version 1. Keys (all always present; unknown values are null):
  format, version, created_unix, versions{sparselift, torch, torchrec, fbgemm_gpu, python},
  command, workload, world_size, local_world_size, device, gpu (rank 0's CUDA device name),
  backend, batch_size,
  warmup, profiled_steps[], tables[{name, num_embeddings, embedding_dim, feature_names, pooling,
  pooling_factor, zipf_alpha, pooling_type, module, feature_processed, data_type,
  zipf_alpha_fitted, hot_ids}],
  sharding[{table, module, sharding_type, compute_kernel, ranks, shards[{rank, offsets, sizes}],
  cache_load_factor}], pipeline, step_times_s[rank][step], peak_memory_bytes[rank],
  files{traces[], execution_traces[], access_stats, hot_ids}, errors[], steady_step_s[].
steady_step_s (one float per step timed after the window with nothing attached, each the slowest
rank's) came later: a manifest without it reads as `[]`, no steady steps timed.
files.hot_ids (the hot-id file's name, null where it was not written) and each table's hot_ids
(`hot_ids.HotIds.summary`: what the file's rows of that table are a part of; null where not
recorded) came later too: a manifest without them has no hot ids (`hot_ids.read_hot_ids`).
hosts[rank] (each rank's host name; ranks per host = local_world_size) and missing_ranks[] (ranks
whose trace did not reach the profile directory: not written, over the per-rank cap, or cut off)
came with multi-host profiles: a manifest without them reads as unknown hosts and none missing.
host_cores[rank] (the cores each rank's process may run on, `usable_cores`; absent in older
manifests) tells whether the ranks of a host had a core each (`profile_manifest.shared_cores`).
batch_transform (the split plans' batch transform timed on a real batch at the end of the
window, `transform_cost.py`; null where nothing was timed, absent in older manifests):
{device, repeats, hot_coverage, baseline_s[rank], elapsed_s[rank], samples[{rank, tables[],
features, ids, seconds}], a_s, b_s, r2}; each sample is what hot/cold splits of `tables` (their
`features` split features routing `ids` ids) add to the batch transformed without splits
(`baseline_s`), each the fastest of `repeats` calls; a_s (per split feature), b_s (per id) fit them
(`sparselift.analysis.transform_fit`), which `sparselift analyze` refits over all samples as
calibration.json's `ops["batch_transform"]`.
recombine (the split model's recombination of pooled embeddings timed forward and backward on
the rank's device at the end of the window, `recombine_cost.py`; null where nothing was timed,
absent in older manifests): {device, repeats, rows[rank], elapsed_s[rank], samples[{rank, split,
read, written, seconds}], b_s, r2}; each sample is the first `split` pooled tables split hot/cold,
`rows` batch rows: `read` pooled elements of their parts, `written` of the model's pooled output,
the fastest call; b_s (per element of read + written, through the origin) fits them
(`sparselift.analysis.recombine_fit`), which `sparselift analyze` refits over all samples as
calibration.json's `ops["recombine"]`.
model_tables ([{name, num_embeddings, embedding_dim, feature_names}], the model's own tables
where the plan in force splits tables and `tables` are its virtual ones; null otherwise, absent in
older manifests) says which model a split plan's profile is of; splits (that plan's splits as
its file writes them, null otherwise) with it describe the plan in force whole.
lookup_s (per rank {window: [[forward, backward], …], steady: [[forward, backward], …]}: the
embedding kernels' own seconds in each profiled step and each steady step, timed by hooks on the
kernel modules, `lookup_timer.py`; null where not timed (CUDA), absent in older manifests) tells
the analysis how much the window slowed the lookups themselves.
split_cost_s (per rank, a list of [transform seconds, split features, ids routed, recombination
seconds forward and backward, pooled elements read, pooled elements written] per steady step:
a split plan's own costs as its steps ran them, `split_timer.py`; null where the plan has no
splits or on CUDA, absent in older manifests) tells the analysis what the split model's
transform and recombination cost in the step, beside what `batch_transform` and `recombine`
timed on their own.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = "sparselift-profile"
VERSION = 1


def versions() -> dict[str, str | None]:
    """Versions of SparseLift, torch, torchrec, fbgemm_gpu and Python (None where unknown)."""
    import torch

    import sparselift

    def _v(module: str) -> str | None:
        try:
            return getattr(__import__(module), "__version__", None)
        except Exception:  # a missing optional package is just unknown
            return None

    return dict(
        sparselift=sparselift.__version__,
        torch=torch.__version__,
        torchrec=_v("torchrec"),
        fbgemm_gpu=_v("fbgemm_gpu"),
        python=platform.python_version(),
    )


def sharding_of(model: Any) -> list[dict[str, Any]]:
    """The plan in force, per table, from DistributedModelParallel's `plan` (plan-file shape)."""
    plan = getattr(model, "plan", None)
    out: list[dict[str, Any]] = []
    for module, module_plan in sorted(getattr(plan, "plan", {}).items()):
        if not hasattr(module_plan, "items"):
            continue
        for table, ps in module_plan.items():
            shards = []
            spec = getattr(ps, "sharding_spec", None)
            for sh in getattr(spec, "shards", None) or []:
                placement = sh.placement
                shards.append(
                    dict(
                        rank=placement.rank() if placement is not None else None,
                        offsets=list(sh.shard_offsets),
                        sizes=list(sh.shard_sizes),
                    )
                )
            cache = getattr(ps, "cache_params", None)
            out.append(
                dict(
                    table=table,
                    module=module,
                    sharding_type=str(ps.sharding_type),
                    compute_kernel=str(ps.compute_kernel),
                    ranks=list(ps.ranks) if ps.ranks is not None else None,
                    shards=shards,
                    cache_load_factor=getattr(cache, "load_factor", None),
                )
            )
    return out


DTYPE_PRECISION = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}
POOLED_OPS = ("POOLED_EMBEDDINGS_ALL_TO_ALL", "POOLED_EMBEDDINGS_REDUCE_SCATTER")


def comm_precision_of(modules: list[Any]) -> dict[str, str]:
    """The pooled-embedding collectives' precision per direction, from the sharded modules' qcomm
    codecs (fp32 where a module has none); the first module with codecs decides.

    Args:
        modules: the sharded embedding modules (`access.find_sharded_modules`' modules).
    Returns:
        {"forward": …, "backward": …}, each "fp32", "fp16", "bf16" or the codec's dtype name.
    """
    for m in modules:
        registry = getattr(m, "qcomm_codecs_registry", None) or {}
        codecs = next((registry[k] for k in POOLED_OPS if k in registry), None)
        if codecs is None:
            continue
        out = {}
        for side in ("forward", "backward"):
            dtype = str(getattr(getattr(codecs, side, None), "quantized_dtype", "torch.float32"))
            out[side] = DTYPE_PRECISION.get(dtype, dtype.removeprefix("torch."))
        return out
    return {"forward": "fp32", "backward": "fp32"}


@dataclass
class ProfileFacts:
    """Everything the manifest says; filled on rank 0 (hook API) or in the parent (CLI)."""

    world_size: int
    local_world_size: int
    device: str
    backend: str | None
    batch_size: int | None
    warmup: int
    profiled_steps: list[int]
    tables: list[dict[str, Any]]
    sharding: list[dict[str, Any]]
    pipeline: str | None
    step_times_s: list[list[float]]
    peak_memory_bytes: list[int]
    traces: list[str]
    execution_traces: list[str]
    command: list[str] | None = None
    workload: str | None = None
    errors: list[str] = field(default_factory=list)
    gpu: str | None = None  # what `optimize` picks a topology preset by
    steady_step_s: list[float] = field(default_factory=list)  # after the window, slowest rank
    comm_precision: dict[str, str] | None = None  # pooled collectives' {forward, backward}
    hot_ids: str | None = None  # hot_ids.parquet where rank 0 wrote it, else None
    hosts: list[str] = field(default_factory=list)  # each rank's host name, in rank order
    missing_ranks: list[int] = field(default_factory=list)  # ranks whose trace is not in files
    host_cores: list[int | None] = field(default_factory=list)  # per rank: its usable cores
    batch_transform: dict[str, Any] | None = None  # `transform_cost.transform_record`
    recombine: dict[str, Any] | None = None  # `recombine_cost.recombine_record`
    # the plans of the side-by-side job it was profiled in (None: TorchRec's planner), this
    # one's included; null: a job of its own. Side by side, peak_memory_bytes is the job's.
    side_by_side_plans: list[str | None] | None = None
    side_by_side_job: str | None = None  # that job's id, shared by its profiles; null: as above
    # side by side, the steps of each of its rounds' turns: steady_step_s is the turns in order
    steady_turn_steps: int | None = None
    # the model's own tables where `tables` are a split plan's virtual ones; null: they are
    model_tables: list[dict[str, Any]] | None = None
    splits: list[dict[str, Any]] | None = None  # that plan's splits, as its file writes them
    # per rank, the embedding kernels' [forward, backward] seconds of each window and steady step
    lookup_s: list[dict[str, list[list[float]]]] | None = None
    # per rank, a split plan's transform and recombination in each steady step (`split_timer`)
    split_cost_s: list[list[list[float]]] | None = None


def usable_cores() -> int | None:
    """The cores this process may run on (its CPU affinity where the OS has one); None: unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def build_manifest(f: ProfileFacts) -> dict[str, Any]:
    """The manifest.json object of `f`, keys in the documented order, stamped with the time."""
    d = asdict(f)
    files = dict(
        traces=d.pop("traces"),
        execution_traces=d.pop("execution_traces"),
        access_stats="access_stats.parquet",
        hot_ids=d.pop("hot_ids"),
    )
    return {
        "format": FORMAT,
        "version": VERSION,
        "created_unix": time.time(),
        "versions": versions(),
        "command": d.pop("command"),
        "workload": d.pop("workload"),
        **d,
        "files": files,
    }


def table_entries(
    metas: list[Any],
    spec_tables: dict[str, Any] | None = None,
    fitted: dict[str, float | None] | None = None,
    hot: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Manifest tables: what the sharded modules declare, plus the spec's pooling and skew.

    Args:
        metas: the tables as the sharded modules declare them.
        spec_tables: the workload spec's tables by name, if the run had a spec.
        fitted: the Zipf exponent fitted to each table's observed ids.
        hot: each table's hot-id summary (`hot_ids.HotIds.summary`), where hot_ids.parquet
            was written; a table without one gets null.
    """
    out = []
    for m in metas:
        s = (spec_tables or {}).get(m.name)
        out.append(
            dict(
                name=m.name,
                num_embeddings=m.num_embeddings,
                embedding_dim=m.embedding_dim,
                feature_names=list(m.features),
                pooling=getattr(s, "pooling", None),
                pooling_factor=getattr(s, "pooling_factor", None),
                zipf_alpha=getattr(s, "zipf_alpha", None),
                pooling_type=m.pooling_type,
                module=m.module,
                feature_processed=m.feature_processed,
                data_type=m.data_type,
                zipf_alpha_fitted=(fitted or {}).get(m.name),
                hot_ids=(hot or {}).get(m.name),
            )
        )
    return out


def split_record(plan: Any) -> dict[str, Any]:
    """What the manifest records of a `plan` (a `plans.Plan` or None) that splits tables, so that
    its sharded modules hold virtual ones: `model_tables` (the model's own tables) and `splits`
    (as the plan file writes them); {} for a plan without splits."""
    if plan is None or not plan.splits:
        return {}
    doc = plan.to_dict()
    return {"model_tables": doc["model"]["tables"], "splits": doc["splits"]}
