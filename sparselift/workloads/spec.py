"""Workload specs: the JSON format of docs/WORKLOADS.md as validated dataclasses.

A spec describes the sparse side of a model and how it is fed; every stage (harness, profiler,
optimizer) reads it, so validation happens once, here, with one-line messages that name the file
and table. Every number is bounded (the limits below): a value no model could have is refused
here rather than failing inside a later stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.jsonfile import loads
from sparselift.plans.types import MAX_EMBEDDING_DIM, MAX_NUM_EMBEDDINGS
from sparselift.workloads.spec_values import format_limit, get, integer, name_of, number, shown

ARCHS = ("dlrm", "dlrm-dcn", "concat-mlp")
# where the harness's model (`models.build_model`) keeps a spec's sequence tables of a dim
SEQUENCE_COLLECTIONS = "model.embedding_collections"


def sequence_collection_name(dim: int) -> str:
    """The name of the harness model's EmbeddingCollection of sequence tables of `dim`."""
    return f"dim{dim}"


def sequence_collection(dim: int) -> str:
    """The path of the harness model's EmbeddingCollection of sequence tables of `dim`."""
    return f"{SEQUENCE_COLLECTIONS}.{sequence_collection_name(dim)}"


POOLINGS = ("fixed", "poisson")
DATA_TYPES = ("fp32", "fp16")  # the weight types FBGEMM's kernels train

# Limits of a spec's numbers (docs/WORKLOADS.md says them; `sparselift workloads --format` too).
MAX_BATCH_SIZE = 2**24  # samples per rank per step
MAX_FEATURES = 2**16  # dense_in_features, and each layer size of dense_arch / over_arch
MAX_DCN_LAYERS = 64
MAX_POOLING_FACTOR = 2**16  # mean ids per sample of one feature
MAX_ZIPF_ALPHA = 10.0


@dataclass(frozen=True)
class TableSpec:
    """One embedding table of a workload and how its feature is fed (see docs/WORKLOADS.md)."""

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    pooling: str = "fixed"
    zipf_alpha: float = 0.0
    feature_names: tuple[str, ...] = ()
    sequence: bool = False  # an EmbeddingCollection's table: one embedding per id, not pooled
    data_type: str = "fp32"  # its weights' type (TorchRec's DataType, lower case)

    @property
    def features(self) -> tuple[str, ...]:
        """The features that look this table up: `feature_names`, else the table's name."""
        return self.feature_names or (self.name,)


@dataclass(frozen=True)
class ModelSpec:
    """The dense side of a workload's model: architecture and layer sizes."""

    arch: str
    dense_arch: tuple[int, ...]
    over_arch: tuple[int, ...]
    interaction: str = "dot"
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512


@dataclass(frozen=True)
class WorkloadSpec:
    """A validated workload: model, tables and batch size; `source` is where it was read from."""

    name: str
    batch_size: int
    dense_in_features: int
    model: ModelSpec
    tables: tuple[TableSpec, ...]
    description: str = ""
    source: str = ""

    def capped(self, max_rows: int | None) -> WorkloadSpec:
        """The same workload with every table's rows hashed into at most `max_rows`.

        Args:
            max_rows: the cap; None for none.
        Raises:
            UserError: `max_rows` is not positive.
        """
        if max_rows is None:
            return self
        if max_rows < 1:
            raise UserError(f"--max-rows must be positive, got {max_rows}")
        tables = tuple(
            dataclasses.replace(t, num_embeddings=min(t.num_embeddings, max_rows))
            for t in self.tables
        )
        return dataclasses.replace(self, tables=tables)

    def fingerprints(self) -> list[dict[str, Any]]:
        """Its tables as a plan file's model fingerprint (what a plan must match)."""
        return [
            dict(
                name=t.name,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                feature_names=list(t.features),
                **({"sequence": True} if t.sequence else {}),
                **({"data_type": t.data_type} if t.data_type != "fp32" else {}),
            )
            for t in self.tables
        ]

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON object in the file format; `parse_workload` reads it back."""
        d = dataclasses.asdict(self)
        d.pop("source")
        d["tables"] = list(d["tables"])
        for t in d["tables"]:
            if not t["feature_names"]:
                t.pop("feature_names")
            else:
                t["feature_names"] = list(t["feature_names"])
            if not t["sequence"]:
                t.pop("sequence")
            if t["data_type"] == "fp32":
                t.pop("data_type")
        d["model"]["dense_arch"] = list(d["model"]["dense_arch"])
        d["model"]["over_arch"] = list(d["model"]["over_arch"])
        return d


def builtin_names() -> list[str]:
    """Names of the workloads shipped with the package (`tiny`, `criteo-kaggle`, …), sorted."""
    return sorted(
        p.name[:-5]
        for p in resources.files(__package__).joinpath("builtin").iterdir()
        if p.name.endswith(".json")
    )


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """Read a built-in workload by name (`tiny`, `criteo-kaggle`, …) or a spec file by path.

    Raises:
        UserError: neither a built-in nor a readable file, malformed JSON, or an invalid spec;
            the message names the file (and the table).
    """
    text_path = str(name_or_path)
    if text_path in builtin_names():
        res = resources.files(__package__).joinpath("builtin", f"{text_path}.json")
        where = f"built-in workload {text_path}"
        return parse_workload(loads(res.read_text(), where), text_path)
    path = Path(text_path)
    if not path.is_file():
        raise UserError(
            f"unknown workload {text_path!r}: not a file and not a built-in "
            f"(built-ins: {', '.join(builtin_names())})"
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the workload spec ({type(e).__name__})") from None
    return parse_workload(loads(text, str(path)), str(path))


def parse_workload(d: Any, source: str) -> WorkloadSpec:
    """Validate a decoded spec and build it.

    Args:
        d: the decoded JSON document.
        source: where it came from, named at the start of every message.
    Raises:
        UserError: the first problem found, naming `source` and, for tables, the table.
    """
    if not isinstance(d, dict):
        raise UserError(f"{source}: a workload spec must be a JSON object")
    name = name_of(d, "name", source)
    description = get(d, "description", str, source) if "description" in d else ""
    batch_size = integer(d, "batch_size", source, MAX_BATCH_SIZE)
    dense_in = integer(d, "dense_in_features", source, MAX_FEATURES)
    model = _parse_model(get(d, "model", dict, source), f"{source}: model")
    raw_tables = get(d, "tables", list, source)
    if not raw_tables:
        raise UserError(f"{source}: the workload has no tables")
    tables = tuple(_parse_table(t, i, source) for i, t in enumerate(raw_tables))
    _check_unique(tables, source)
    seq = [t for t in tables if t.sequence]
    if model.arch in ("dlrm", "dlrm-dcn"):
        if seq:
            raise UserError(
                f"{source}: table {seq[0].name!r} is a sequence table, which {model.arch} cannot "
                f"take (it pools every feature): use arch concat-mlp"
            )
        last = model.dense_arch[-1]
        wrong = [t.name for t in tables if t.embedding_dim != last]
        if wrong:
            raise UserError(
                f"{source}: {model.arch} needs every table's embedding_dim equal to dense_arch's "
                f"last layer ({last}); tables {', '.join(wrong)} differ "
                f"(use arch concat-mlp for mixed dims)"
            )
    return WorkloadSpec(
        name=name,
        batch_size=batch_size,
        dense_in_features=dense_in,
        model=model,
        tables=tables,
        description=description,
        source=source,
    )


def _parse_model(m: dict[str, Any], where: str) -> ModelSpec:
    source = where.removesuffix(": model")
    arch = get(m, "arch", str, where)
    if arch not in ARCHS:
        raise UserError(f"{source}: model.arch {arch!r} is not one of {', '.join(ARCHS)}")
    layers = {}
    for key in ("dense_arch", "over_arch"):
        sizes = get(m, key, list, where)
        if not sizes or not all(
            isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= MAX_FEATURES for s in sizes
        ):
            raise UserError(
                f"{source}: model.{key} must be a non-empty list of integers in "
                f"1..{format_limit(MAX_FEATURES)}"
            )
        layers[key] = tuple(sizes)
    if layers["over_arch"][-1] != 1:
        raise UserError(
            f"{source}: model.over_arch must end in 1 (one logit), got {layers['over_arch'][-1]}"
        )
    if arch != "concat-mlp" and len(layers["over_arch"]) < 2:
        raise UserError(
            f"{source}: model.over_arch of {arch} needs at least 2 layers (TorchRec's OverArch), "
            f"got {list(layers['over_arch'])}"
        )
    interaction = (
        get(m, "interaction", str, where)
        if "interaction" in m
        else ("dcn" if arch == "dlrm-dcn" else "dot")
    )
    return ModelSpec(
        arch=arch,
        interaction=interaction,
        dcn_num_layers=integer(m, "dcn_num_layers", where, MAX_DCN_LAYERS, 3),
        dcn_low_rank_dim=integer(m, "dcn_low_rank_dim", where, MAX_FEATURES, 512),
        **layers,
    )


def _parse_table(t: Any, i: int, source: str) -> TableSpec:
    where = f"{source}: table #{i}"
    if not isinstance(t, dict):
        raise UserError(f"{where} must be an object")
    name = name_of(t, "name", where)
    where = f"{source}: table {name!r}"
    _check_table_name(name, where)
    rows = integer(t, "num_embeddings", where, MAX_NUM_EMBEDDINGS)
    dim = integer(t, "embedding_dim", where, MAX_EMBEDDING_DIM)
    if dim % 4:
        raise UserError(
            f"{where}: embedding_dim must be a multiple of 4 (FBGEMM's kernels, which TorchRec "
            f"shards tables with, need it), got {dim}"
        )
    pf = number(t, "pooling_factor", where, 1.0, MAX_POOLING_FACTOR, 1.0)
    pooling = get(t, "pooling", str, where) if "pooling" in t else "fixed"
    if pooling not in POOLINGS:
        raise UserError(f"{where}: pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
    if pooling == "fixed" and pf != int(pf):
        raise UserError(f"{where}: fixed pooling needs an integer pooling_factor, got {pf}")
    alpha = number(t, "zipf_alpha", where, 0.0, MAX_ZIPF_ALPHA, 0.0)
    named = "feature_names" in t
    features = tuple(get(t, "feature_names", list, where) if named else [])
    if (named and not features) or not all(isinstance(f, str) and f for f in features):
        raise UserError(f"{where}: feature_names must be a non-empty list of non-empty strings")
    sequence = t.get("sequence", False)
    if not isinstance(sequence, bool):
        raise UserError(f"{where}: 'sequence' must be true or false, got {shown(sequence)}")
    data_type = get(t, "data_type", str, where) if "data_type" in t else "fp32"
    if data_type not in DATA_TYPES:
        raise UserError(f"{where}: data_type {data_type!r} is not one of {', '.join(DATA_TYPES)}")
    return TableSpec(
        name=name,
        num_embeddings=rows,
        embedding_dim=dim,
        pooling_factor=pf,
        pooling=pooling,
        zipf_alpha=alpha,
        feature_names=features,
        sequence=sequence,
        data_type=data_type,
    )


def _check_table_name(name: str, where: str) -> None:
    """Refuse a name TorchRec cannot hold: it keeps tables in a torch ModuleDict, keyed by name.

    Raises:
        UserError: the name holds a '.', or is an attribute of ModuleDict (`items`, `keys`, …).
    """
    import torch

    if "." in name:
        raise UserError(f"{where}: a table name cannot hold '.' (TorchRec names modules by it)")
    if hasattr(torch.nn.ModuleDict(), name):
        raise UserError(
            f"{where}: {name!r} cannot name a table: TorchRec keeps tables in a torch ModuleDict, "
            f"where {name!r} is taken; rename the table (feature_names may keep the name)"
        )


def _check_unique(tables: tuple[TableSpec, ...], source: str) -> None:
    seen_tables: set[str] = set()
    fed: dict[str, str] = {}  # feature → the table it feeds
    for t in tables:
        if t.name in seen_tables:
            raise UserError(f"{source}: table name {t.name!r} appears twice")
        seen_tables.add(t.name)
        for f in t.features:
            if f in fed:
                why = "is listed twice" if fed[f] == t.name else f"already feeds table {fed[f]!r}"
                raise UserError(f"{source}: table {t.name!r}: feature {f!r} {why}")
            fed[f] = t.name
