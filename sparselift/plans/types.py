"""The parts of a plan: what each section of a plan file holds, as frozen or plain dataclasses.

These are leaves: they import nothing of ours, so the modules that check a plan
(`schema`, `consistency`) and turn it into TorchRec objects (`to_torchrec`) can use them without
importing `plan.py`, which uses those modules in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FORMAT = "sparselift-plan"
VERSION = 2  # the newest plan format this package reads and writes
VERSION_WITHOUT_SPLITS = 1  # a plan without splits is written as version 1, as before splits
DEFAULT_CACHE_LOAD_FACTOR = 0.2  # the UVM cache size TorchRec and FBGEMM use when none is given

# The largest model and job a plan describes. Far beyond today's largest tables and jobs, small
# enough that every byte, element and id count derived from them fits a 64-bit integer.
MAX_NUM_EMBEDDINGS = 2**40  # rows of one table
MAX_EMBEDDING_DIM = 2**16  # columns of one table
MAX_WORLD_SIZE = 2**16  # ranks


# bytes an element of a table's weights takes, by TorchRec DataType (lower case; all of them)
WEIGHT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "int64": 8.0, "int32": 4.0, "int8": 1.0}
WEIGHT_BYTES |= {"uint8": 1.0, "int4": 0.5, "int2": 0.25, "nfp8": 1.0}


@dataclass(frozen=True)
class TableFingerprint:
    """One embedding table of the model a plan is for: what must match when the plan is loaded.

    Attributes:
        name: the table's name in the EmbeddingBagCollection.
        num_embeddings: rows.
        embedding_dim: columns.
        feature_names: the sparse features that look up this table, in order.
        sequence: the table is an EmbeddingCollection's (one embedding per id, unpooled), not an
            EmbeddingBagCollection's: its output collectives carry every id's row, and TorchRec
            shards it only table-, column-, row-wise or data-parallel.
        module: the path of its collection in the model the plan was made for, where the writer
            knew it (None: not recorded). Not matched against a model (wrappers move paths):
            where the loader shards the table when given no model, and which collectives it
            shares (each collection runs its own).
        data_type: its weights' type (TorchRec's DataType, lower case: "fp32", "fp16", ...):
            what the plan's memory was counted in.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    sequence: bool = False
    module: str | None = None
    data_type: str = "fp32"

    @classmethod
    def from_any(cls, t: TableFingerprint | dict[str, Any]) -> TableFingerprint:
        """`t` itself, or the fingerprint a plan-file table dict describes.

        Args:
            t: a fingerprint, or a dict with `name`, `num_embeddings`, `embedding_dim` and optional
                `feature_names` (default: the table's name), `sequence` (default: false),
                `module` (default: None) and `data_type` (default: "fp32").
        Returns:
            The fingerprint, sizes as Python ints.
        Raises:
            KeyError: a required key is missing (callers validate the dict first).
        """
        if isinstance(t, TableFingerprint):
            return t
        return cls(
            name=t["name"],
            num_embeddings=int(t["num_embeddings"]),
            embedding_dim=int(t["embedding_dim"]),
            feature_names=tuple(t.get("feature_names") or (t["name"],)),
            sequence=bool(t.get("sequence", False)),
            module=t.get("module"),
            data_type=str(t.get("data_type") or "fp32"),
        )


@dataclass(frozen=True)
class PlanTopology:
    """The ranks a plan is for.

    Attributes:
        world_size: ranks in the job.
        local_world_size: ranks per host; divides `world_size`.
        device: "cpu" or "cuda".
        preset: the named hardware the plan was made for (optimizer presets), if any.
    """

    world_size: int
    local_world_size: int
    device: str = "cpu"
    preset: str | None = None


@dataclass(frozen=True)
class Shard:
    """A block of a table on `rank`.

    Rows [offsets[0], offsets[0] + sizes[0]) × columns [offsets[1], offsets[1] + sizes[1]).
    """

    rank: int
    offsets: tuple[int, int]
    sizes: tuple[int, int]


@dataclass
class TablePlan:
    """How one table is sharded: everything TorchRec's ParameterSharding needs.

    Attributes:
        name: the table (a `TableFingerprint.name` of the plan's model).
        sharding_type: a TorchRec ShardingType value ("table_wise", "row_wise", …).
        compute_kernel: a TorchRec EmbeddingComputeKernel value ("fused", "dense", …).
        ranks: the ranks holding the table; for sharded types, the shards' ranks in shard order.
        shards: the blocks and their ranks; empty for data_parallel (every rank holds it whole).
        cache_load_factor: UVM cache share of the table, only with "fused_uvm_caching".
    """

    name: str
    sharding_type: str
    compute_kernel: str
    ranks: list[int]
    shards: list[Shard] = field(default_factory=list)
    cache_load_factor: float | None = None

    @property
    def cache_share(self) -> float | None:
        """The UVM cache's share of the table as it runs, None without a UVM cache.

        TorchRec and FBGEMM size the cache at DEFAULT_CACHE_LOAD_FACTOR when the plan names none
        (TorchRec's planner leaves it out by default), so this is what memory estimates must use.
        """
        if self.compute_kernel == "fused_uvm_caching" and self.cache_load_factor is None:
            return DEFAULT_CACHE_LOAD_FACTOR
        return self.cache_load_factor


@dataclass
class CommPrecision:
    """qcomm precision of the sharded collectives, per direction: "fp32", "fp16" or "bf16"."""

    forward: str = "fp32"
    backward: str = "fp32"


SPLIT_KINDS = ("hot_cold", "row_ranges", "column_slices")


@dataclass(frozen=True)
class Split:
    """A model table rewritten as virtual tables, each sharded on its own (plan format 2).

    Attributes:
        table: the model table split (a `TableFingerprint.name` of the plan's model).
        kind: "hot_cold" (`parts` = (hot, cold): the rows `hot_ids` become a small table, the
            hot part; the cold part keeps the table's every row, its hot rows never looked up),
            "row_ranges" (part i holds rows `ranges[i]` of the table, ids shifted to start at 0)
            or "column_slices" (part i holds columns `ranges[i]`, every row; each id is looked up
            in every part and the pooled slices are concatenated).
        parts: the virtual tables' names, in the order above.
        hot_ids: hot_cold only: the table rows of the hot part, in the hot part's row order.
        ranges: row_ranges / column_slices only: [start, end) per part, tiling the rows (columns).
    """

    table: str
    kind: str
    parts: tuple[str, ...]
    hot_ids: tuple[int, ...] = ()
    ranges: tuple[tuple[int, int], ...] = ()
