"""Workload specs: the JSON format of `shared/workloads/README.md` as validated dataclasses.

A spec describes the sparse side of a model and how it is fed; every stage (harness, profiler,
optimizer) reads it, so validation happens once, here, with messages that name the file and table.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sparselift.errors import UserError

ARCHS = ("dlrm", "dlrm-dcn", "concat-mlp")
POOLINGS = ("fixed", "poisson")


@dataclass(frozen=True)
class TableSpec:
    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    pooling: str = "fixed"
    zipf_alpha: float = 0.0
    feature_names: tuple[str, ...] = ()

    @property
    def features(self) -> tuple[str, ...]:
        return self.feature_names or (self.name,)


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    dense_arch: tuple[int, ...]
    over_arch: tuple[int, ...]
    interaction: str = "dot"
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    batch_size: int
    dense_in_features: int
    model: ModelSpec
    tables: tuple[TableSpec, ...]
    description: str = ""
    source: str = ""  # where it was read from, for messages

    def capped(self, max_rows: int | None) -> WorkloadSpec:
        """The same workload with every table's rows hashed into at most `max_rows`."""
        if not max_rows:
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
            )
            for t in self.tables
        ]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        d["tables"] = list(d["tables"])
        for t in d["tables"]:
            if not t["feature_names"]:
                t.pop("feature_names")
            else:
                t["feature_names"] = list(t["feature_names"])
        d["model"]["dense_arch"] = list(d["model"]["dense_arch"])
        d["model"]["over_arch"] = list(d["model"]["over_arch"])
        return d


def builtin_names() -> list[str]:
    return sorted(
        p.name[:-5]
        for p in resources.files(__package__).joinpath("builtin").iterdir()
        if p.name.endswith(".json")
    )


def load_workload(name_or_path: str | Path) -> WorkloadSpec:
    """Read a built-in workload by name (`tiny`, `criteo-kaggle`, …) or a spec file by path."""
    text_path = str(name_or_path)
    if text_path in builtin_names():
        res = resources.files(__package__).joinpath("builtin", f"{text_path}.json")
        return parse_workload(
            _load_json(res.read_text(), f"built-in workload {text_path}"), text_path
        )
    path = Path(text_path)
    if not path.is_file():
        raise UserError(
            f"unknown workload {text_path!r}: not a file and not a built-in "
            f"(built-ins: {', '.join(builtin_names())})"
        )
    return parse_workload(_load_json(path.read_text(), str(path)), str(path))


def _load_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{where}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None


def _get(d: dict, key: str, kind: type | tuple, where: str, default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise UserError(f"{where}: missing key {key!r}")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, kind):
        raise UserError(f"{where}: {key!r} must be {_kind_name(kind)}, got {v!r}")
    return v


def _kind_name(kind: type | tuple) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "an object"}[
            k
        ]
        for k in kinds
    )


def parse_workload(d: Any, source: str) -> WorkloadSpec:
    """Validate a decoded spec; every message names `source` and, for tables, the table."""
    if not isinstance(d, dict):
        raise UserError(f"{source}: a workload spec must be a JSON object")
    name = _get(d, "name", str, source)
    batch_size = _get(d, "batch_size", int, source)
    if batch_size < 1:
        raise UserError(f"{source}: batch_size must be positive, got {batch_size}")
    dense_in = _get(d, "dense_in_features", int, source)
    if dense_in < 1:
        raise UserError(f"{source}: dense_in_features must be positive, got {dense_in}")
    m = _get(d, "model", dict, source)
    arch = _get(m, "arch", str, f"{source}: model")
    if arch not in ARCHS:
        raise UserError(f"{source}: model.arch {arch!r} is not one of {', '.join(ARCHS)}")
    layers = {}
    for key in ("dense_arch", "over_arch"):
        sizes = _get(m, key, list, f"{source}: model")
        if not sizes or not all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes
        ):
            raise UserError(f"{source}: model.{key} must be a non-empty list of positive integers")
        layers[key] = tuple(sizes)
    if layers["over_arch"][-1] != 1:
        raise UserError(
            f"{source}: model.over_arch must end in 1 (one logit), got {layers['over_arch'][-1]}"
        )
    model = ModelSpec(
        arch=arch,
        interaction=_get(
            m, "interaction", str, f"{source}: model", "dcn" if arch == "dlrm-dcn" else "dot"
        ),
        dcn_num_layers=_get(m, "dcn_num_layers", int, f"{source}: model", 3),
        dcn_low_rank_dim=_get(m, "dcn_low_rank_dim", int, f"{source}: model", 512),
        **layers,
    )
    raw_tables = _get(d, "tables", list, source)
    if not raw_tables:
        raise UserError(f"{source}: the workload has no tables")
    tables = tuple(_parse_table(t, i, source) for i, t in enumerate(raw_tables))
    _check_unique(tables, source)
    if arch in ("dlrm", "dlrm-dcn"):
        last = model.dense_arch[-1]
        wrong = [t.name for t in tables if t.embedding_dim != last]
        if wrong:
            raise UserError(
                f"{source}: {arch} needs every table's embedding_dim equal to dense_arch's last layer "
                f"({last}); tables {', '.join(wrong)} differ (use arch concat-mlp for mixed dims)"
            )
    return WorkloadSpec(
        name=name,
        batch_size=batch_size,
        dense_in_features=dense_in,
        model=model,
        tables=tables,
        description=d.get("description", ""),
        source=source,
    )


def _parse_table(t: Any, i: int, source: str) -> TableSpec:
    where = f"{source}: table #{i}"
    if not isinstance(t, dict):
        raise UserError(f"{where} must be an object")
    name = _get(t, "name", str, where)
    where = f"{source}: table {name!r}"
    rows = _get(t, "num_embeddings", int, where)
    dim = _get(t, "embedding_dim", int, where)
    if rows < 1:
        raise UserError(f"{where}: num_embeddings must be positive, got {rows}")
    if dim < 1:
        raise UserError(f"{where}: embedding_dim must be positive, got {dim}")
    pf = float(_get(t, "pooling_factor", (int, float), where, 1.0))
    if pf < 1:
        raise UserError(f"{where}: pooling_factor must be at least 1, got {pf}")
    pooling = _get(t, "pooling", str, where, "fixed")
    if pooling not in POOLINGS:
        raise UserError(f"{where}: pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
    if pooling == "fixed" and pf != int(pf):
        raise UserError(f"{where}: fixed pooling needs an integer pooling_factor, got {pf}")
    alpha = float(_get(t, "zipf_alpha", (int, float), where, 0.0))
    if alpha < 0:
        raise UserError(f"{where}: zipf_alpha must be >= 0, got {alpha}")
    features = tuple(_get(t, "feature_names", list, where, []))
    if not all(isinstance(f, str) and f for f in features):
        raise UserError(f"{where}: feature_names must be a list of non-empty strings")
    return TableSpec(
        name=name,
        num_embeddings=rows,
        embedding_dim=dim,
        pooling_factor=pf,
        pooling=pooling,
        zipf_alpha=alpha,
        feature_names=features,
    )


def _check_unique(tables: tuple[TableSpec, ...], source: str) -> None:
    seen_tables: set[str] = set()
    seen_features: set[str] = set()
    for t in tables:
        if t.name in seen_tables:
            raise UserError(f"{source}: table name {t.name!r} appears twice")
        seen_tables.add(t.name)
        for f in t.features:
            if f in seen_features:
                raise UserError(
                    f"{source}: table {t.name!r}: feature {f!r} is already fed to another table"
                )
            seen_features.add(f)
