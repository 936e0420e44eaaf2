"""`Plan`: a whole SparseLift plan, its translation to and from the file, and a trainer's verbs.

The file format is `plan.schema.json`; `to_dict`/`from_dict` (`plan_dict.py`) are the only
translation between the two, and `from_dict` is the one place a plan is validated (schema, then
consistency; the statistics digest's own checks are in `digest.py`). The TorchRec
side (`sharding_plan`, `sharders`, `apply`, …) lives in `to_torchrec.py` and is imported on first
use, so reading and checking a plan does not pay for importing torchrec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparselift.plans.consistency import fit_problems
from sparselift.plans.digest import STATISTICS_FIELDS, statistics_problems
from sparselift.plans.errors import PlanError
from sparselift.plans.plan_dict import plan_from_dict, plan_to_dict
from sparselift.plans.splits import sharded_tables
from sparselift.plans.types import (
    DEFAULT_CACHE_LOAD_FACTOR,
    FORMAT,
    VERSION,
    CommPrecision,
    PlanTopology,
    Shard,
    Split,
    TableFingerprint,
    TablePlan,
)

# Re-exported: `sparselift.plans.plan` has always offered the parts along with the whole.
__all__ = [
    "DEFAULT_CACHE_LOAD_FACTOR",
    "FORMAT",
    "VERSION",
    "CommPrecision",
    "Plan",
    "PlanTopology",
    "STATISTICS_FIELDS",
    "Shard",
    "Split",
    "TableFingerprint",
    "TablePlan",
    "statistics_problems",
]


@dataclass
class Plan:
    """How every embedding table of one model is sharded over one topology.

    Attributes:
        model: the model's tables, in the model's order (what the plan must be loaded against).
        topology: the ranks the plan is for.
        tables: one TablePlan per table as sharded: each model table, except that a split
            table is replaced by its parts (`sharded_tables()`).
        comm_precision: qcomm precision of the sharded collectives.
        pipeline: the train pipeline, "base" or "sparse-dist".
        module: FQN of the EmbeddingBagCollection in the train module, if known.
        predicted: what the planner predicted (step time, per-rank costs); free-form.
        solver: the planner and its result (status, objective, bound, gap, …); free-form.
        provenance: what the plan was made from; free-form.
        evidence: per cost coefficient the plan was priced with, where it came from:
            {name: {"source": "measured" | "assumed", "from": profile path or preset}}; None in
            plans made without it (older plans, TorchRec's). Written only when present, so a
            plan without it keeps its bytes.
        statistics: the table statistics the plan was made from, per table
            {name: {"ids_per_step", "unique_ratio", "pooling", "hot_share"}} (see
            `STATISTICS_FIELDS`; `sparselift.optimizer.planio.statistics_digest` writes it), what
            `sparselift plan check` compares a new profile with; None in plans made without it.
            Written only when present, as `evidence`.
        splits: model tables rewritten as virtual tables (plan format 2; see `splits.py`).
            A plan without splits is written as format version 1, byte for byte as before.
        source: the file it came from, for messages (not part of the plan: not compared).
    """

    model: list[TableFingerprint]
    topology: PlanTopology
    tables: list[TablePlan]
    comm_precision: CommPrecision = field(default_factory=CommPrecision)
    pipeline: str = "base"
    module: str | None = None
    predicted: dict[str, Any] | None = None
    solver: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    evidence: dict[str, dict[str, str]] | None = None
    statistics: dict[str, dict[str, float]] | None = None
    splits: list[Split] = field(default_factory=list)
    source: str = field(default="<plan>", compare=False)

    # ---------------------------------------------------------------------------- file format

    def to_dict(self) -> dict[str, Any]:
        """The plan file's JSON object: keys in the documented order, tables in model order (a
        split table's parts in its place, in part order).

        Free-form values (`predicted`, `solver`, `provenance`, cache_load_factor) are made
        canonical — sorted keys, floats to 10 significant digits, non-finite floats as null — so
        that equal plans give equal bytes.
        """
        return plan_to_dict(self)

    @classmethod
    def from_dict(cls, d: Any, source: str = "<plan>") -> Plan:
        """Validate a decoded plan file (schema, then consistency) and build the plan.

        Args:
            d: the decoded JSON document.
            source: where it came from, named in every message.
        Returns:
            The plan, integers as Python ints (JSON Schema counts 2.0 as an integer).
        Raises:
            PlanError: listing every problem found (not only the first).
        """
        return plan_from_dict(cls, d, source)

    def table(self, name: str) -> TablePlan:
        """The TablePlan of table `name`; KeyError if the plan has none."""
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def sharded_tables(self) -> list[TableFingerprint]:
        """The tables as sharded, in model order: a split table's parts in its place.

        These are the fingerprints of `tables` (each virtual table's rows, dim and features);
        equal to `model` for a plan without splits.
        """
        return sharded_tables(self.model, self.splits)

    # ------------------------------------------------------------------------- fit to a model

    def check_spec(
        self, tables: list[dict[str, Any]] | list[TableFingerprint], world_size: int
    ) -> None:
        """Refuse a model's tables or a world size the plan was not made for.

        Args:
            tables: the model's tables (fingerprints or plan-file table dicts).
            world_size: the ranks the plan is about to run on.
        Raises:
            PlanError: listing every difference (missing, extra or resized tables, other
                features, another world size).
        """
        problems = fit_problems(self, [TableFingerprint.from_any(t) for t in tables], world_size)
        if problems:
            raise PlanError(self.source, problems)

    def check(self, model: Any, world_size: int) -> None:
        """`check_spec` against the collections found in the unsharded `model` (a split model's
        stand-ins count as the collections they replaced).

        Raises:
            PlanError: as `check_spec`, or a table name that two collections of `model` use.
        """
        from sparselift.plans.to_torchrec import duplicate_problems, original_tables

        found = original_tables(model)
        duplicates = duplicate_problems(found)
        if duplicates:
            raise PlanError(self.source, duplicates)
        self.check_spec([t.table for t in found], world_size)

    # ------------------------------------------------------------------------------- TorchRec

    def sharding_plan(self, model: Any = None):
        """TorchRec's ShardingPlan; module paths from `model` if given, else the plan's `module`.

        Raises:
            PlanError: `model` lacks a table of the plan.
        """
        from sparselift.plans.to_torchrec import sharding_plan

        return sharding_plan(self, model)

    def sharders(self) -> list[Any]:
        """TorchRec's sharder of each kind of collection (EmbeddingBagCollection first), with
        qcomm codecs for `comm_precision`."""
        from sparselift.plans.to_torchrec import sharders

        return sharders(self)

    def pipeline_class(self) -> type:
        """TorchRec's train pipeline class for `pipeline` (TrainPipelineBase / …SparseDist)."""
        from sparselift.plans.to_torchrec import pipeline_class

        return pipeline_class(self.pipeline)

    def apply(self, model: Any, pg: Any, device: Any):
        """Check the plan against `model` and the group, then shard it: a DistributedModelParallel.

        Args:
            model: the unsharded train module (tables on `meta` are fine).
            pg: the process group it runs in.
            device: the device of this rank.
        Raises:
            PlanError: the plan does not fit the model, the group's size or the device kind;
                checked before anything is built.
        """
        from sparselift.plans.to_torchrec import apply

        return apply(self, model, pg, device)

    # ------------------------------------------------------------------- plans with splits

    def rewrite(self, model: Any) -> Any:
        """The split model: `model`'s collections with split tables replaced by VirtualTables
        (in place; `apply` does it). Unchanged without splits.

        Raises:
            PlanError: a split that would not train exactly (see `rewrite.rewrite_problems`).
        """
        from sparselift.plans.rewrite import rewrite

        return rewrite(self, model)

    def batch_transform(self) -> Any:
        """The batch transform of this plan (`transform.BatchTransform`), made once: of the
        tables of the collections that hold split tables, once `rewrite` (or `apply`) has seen
        the model (a batch of another collection need not carry them), else of every table."""
        transform = self.__dict__.get("_transform")
        if transform is None:
            from sparselift.plans.transform import BatchTransform

            mine = self.__dict__.get("_transform_tables")
            model = [t for t in self.model if mine is None or t.name in mine]
            transform = BatchTransform(model, self.splits, self.source)
            self.__dict__["_transform"] = transform
        return transform

    def transform_batch(self, batch: Any) -> Any:
        """`batch` (a TorchRec Batch, any object with `sparse_features`, or a KJT) as the split
        model takes it: each split feature's ids on its virtual features. The same batch
        without splits.

        Raises:
            PlanError: the batch lacks a feature of the plan, or a split feature has ids beyond
                its table (naming the table, the feature and the ids).
        """
        if not self.splits:
            return batch
        return self.batch_transform().batch(batch)

    def transform_loader(self, batches: Any, ahead: int = 0) -> Any:
        """An iterator over `batches` (e.g. a DataLoader), each transformed as it is drawn, or
        with `ahead` > 0 up to that many batches ahead in a background thread
        (`transform.BatchTransform.loader`)."""
        if not self.splits:
            return iter(batches)
        return self.batch_transform().loader(batches, ahead)

    def to_virtual_state(self, state: Any) -> dict[str, Any]:
        """A model state dict of full tensors in the original layout as the split model's
        (`checkpoint.to_virtual`); `to_original_state` is the inverse, bit for bit."""
        from sparselift.plans.checkpoint import to_virtual

        return to_virtual(self, state)

    def to_original_state(self, state: Any) -> dict[str, Any]:
        """The split model's full state dict in the original layout (`checkpoint.to_original`)."""
        from sparselift.plans.checkpoint import to_original

        return to_original(self, state)

    def to_virtual_optimizer_state(self, state: Any) -> dict[str, Any]:
        """An optimizer state ({weight name: {state name: full tensor}}) in the original layout
        as the split model's (`checkpoint.optimizer_to_virtual`)."""
        from sparselift.plans.checkpoint import optimizer_to_virtual

        return optimizer_to_virtual(self, state)

    def to_original_optimizer_state(self, state: Any) -> dict[str, Any]:
        """The split model's optimizer state in the original layout (the inverse)."""
        from sparselift.plans.checkpoint import optimizer_to_original

        return optimizer_to_original(self, state)

    def plan_loader(self, model: Any = None):
        """A TorchRec PlanLoader serving this plan to `EmbeddingShardingPlanner(plan_loader=...)`.

        Raises:
            PlanError: `model` lacks a table of the plan.
        """
        from sparselift.plans.to_torchrec import SparseLiftPlanLoader

        return SparseLiftPlanLoader(self, model)
