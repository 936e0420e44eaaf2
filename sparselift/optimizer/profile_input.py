"""What planning reads from a profile directory: its table statistics, batch size and calibration.

One reader for every command that plans or prices from a profile (`optimize --profile`, `plan
check`), so that they refuse the same directories with the same messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift import plans
from sparselift.calibration import read_checked
from sparselift.errors import UserError
from sparselift.optimizer.table_stats import TableStats, stats_from_profile
from sparselift.profile_manifest import check_unique_tables, is_sequence_table, read_manifest
from sparselift.profiler.hot_ids import HotIds, read_hot_ids


@dataclass
class ProfileInput:
    """A profile directory as planning reads it.

    Attributes:
        stats: the tables as profiled (`stats_from_profile`), in the profile's order.
        batch_size: samples per rank.
        calibration: calibration.json's object, or None where the profile has none.
        plan_in_force: the plan the profiled run trained with (`plan_in_force`), or None where
            the manifest does not describe it whole.
        hot_ids: each table's hottest ids (`hot_ids.parquet`), or None where the profile did
            not record them.
    """

    stats: list[TableStats]
    batch_size: int
    calibration: dict[str, Any] | None
    plan_in_force: plans.Plan | None = None
    hot_ids: dict[str, HotIds] | None = None


def read_profile(profile_dir: str | Path, *, need_calibration: bool) -> ProfileInput:
    """Read a profile directory's statistics and, if it has one, its calibration.

    Args:
        profile_dir: the directory (`sparselift profile`'s output, analyzed or not).
        need_calibration: refuse a directory without calibration.json (`optimize`: it plans with
            measured coefficients only).
    Returns:
        The statistics, batch size and calibration.
    Raises:
        UserError: not a directory; a profile of a model with split tables; no calibration.json
            where needed; a bad calibration.json, manifest.json (`read_manifest`),
            access_stats.parquet or hot_ids.parquet (the message names the file).
    """
    cal = Path(profile_dir, "calibration.json")
    if not Path(profile_dir).is_dir():
        raise UserError(f"{profile_dir}: not a profile directory")
    if need_calibration and not cal.is_file():
        raise UserError(
            f"{profile_dir} has no calibration.json: run `sparselift analyze {profile_dir}` first"
        )
    calibration = read_checked(cal) if cal.is_file() else None
    manifest = read_manifest(profile_dir)
    check_unique_tables(profile_dir, manifest)
    stats, batch = stats_from_profile(profile_dir)
    virtual = [s.name for s in stats if _virtual(s)]
    if virtual:
        raise UserError(
            f"{profile_dir}: profiled with a plan that splits tables (virtual tables "
            f"{', '.join(virtual[:3])}{' …' if len(virtual) > 3 else ''}); planning reads the "
            "model's own tables: give a profile of the job under a plan without splits too"
        )
    recorded = (manifest.get("files") or {}).get("hot_ids")
    hot = read_hot_ids(profile_dir) if recorded else None
    return ProfileInput(stats, batch, calibration, plan_in_force(manifest), hot)


def _virtual(t: TableStats) -> bool:
    """Whether `t` is a virtual table of a split: its features are `virtual_feature(f, t)`."""
    names = t.feature_names
    return bool(names) and all(f.endswith("/" + t.name) for f in names)


PIPELINES = {"TrainPipelineBase": "base", "TrainPipelineSparseDist": "sparse-dist"}


def _module_of(entry: Any) -> dict[str, str]:
    """{"module": its collection's path} of a manifest's sharding entry, where it names one."""
    module = entry.get("module") if isinstance(entry, dict) else None
    return {"module": module} if isinstance(module, str) else {}


def plan_in_force(manifest: dict[str, Any]) -> plans.Plan | None:
    """The plan a profiled run trained with, rebuilt from its manifest (tables, sharding,
    pipeline, comm precision): the plan a new one must be predicted to beat.

    A split plan's profile shards virtual tables: its plan is rebuilt with the model's tables
    (`model_tables`) and the splits (`splits`) the manifest records.

    Returns:
        The plan, or None where the manifest does not describe it whole (an older manifest, a
        pipeline other than TorchRec's two, a table without its sharding, virtual tables without
        their splits): then it is not a candidate.
    """
    sharding = {e.get("table"): e for e in manifest.get("sharding") or []}
    tables = manifest.get("tables") or []
    pipeline = PIPELINES.get(str(manifest.get("pipeline")))
    if not tables or pipeline is None or any(t.get("name") not in sharding for t in tables):
        return None
    model, splits = manifest.get("model_tables"), manifest.get("splits")
    if bool(model) != bool(splits):
        return None
    doc = {
        "format": plans.FORMAT,
        "version": 2 if splits else 1,
        "model": {
            "tables": [
                {
                    **{
                        k: t.get(k)
                        for k in ("name", "num_embeddings", "embedding_dim", "feature_names")
                    },
                    # an EmbeddingCollection's table: the profiler's pooling_type, the plan's flag
                    **({"sequence": True} if is_sequence_table(t) else {}),
                    # its weights' type where not fp32 (what the loader matches the model on)
                    **(
                        {"data_type": t["data_type"]}
                        if t.get("data_type", "fp32") != "fp32"
                        else {}
                    ),
                    # where its collection is (a split plan's sharded paths are its stand-ins')
                    **({} if splits else _module_of(sharding.get(t.get("name")))),
                }
                for t in model or tables
            ]
        },
        "topology": {
            "world_size": manifest.get("world_size"),
            "local_world_size": manifest.get("local_world_size"),
            "device": manifest.get("device"),
            "preset": None,
        },
        "tables": [
            {
                "name": t["name"],
                **{
                    k: sharding[t["name"]].get(k)
                    for k in ("sharding_type", "compute_kernel", "ranks", "shards")
                },
                "cache_load_factor": sharding[t["name"]].get("cache_load_factor"),
            }
            for t in tables
        ],
        "comm_precision": manifest.get("comm_precision") or {"forward": "fp32", "backward": "fp32"},
        "pipeline": pipeline,
        **({"splits": splits} if splits else {}),
    }
    try:
        return plans.Plan.from_dict(doc, "the profiled plan")
    except plans.PlanError:
        return None
