"""Per-table statistics the cost model prices options with: sizes, ids per sample, hot-row skew.

They come either from a workload spec (pooling_factor, zipf_alpha: what-if planning) or from a
profile's `access_stats.parquet` (what was measured). A `TableStats` is frozen and hashable so the
cost model can cache terms per (table stats, option): changing one table's statistics invalidates
only that table's terms.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.kernels import expected_unique, expected_unique_past, zipf_share
from sparselift.plans.types import WEIGHT_BYTES
from sparselift.profile_manifest import is_sequence_table
from sparselift.workloads.spec import WorkloadSpec, sequence_collection


@dataclass(frozen=True)
class TableStats:
    """One table's sizes and access statistics (frozen: a cache key of the cost model)."""

    name: str
    num_embeddings: int
    embedding_dim: int
    ids_per_sample: float  # mean pooling factor (over all the table's features)
    zipf_alpha: float = 0.0
    top1pct_share: float | None = None  # measured share of accesses to the hottest 1% rows
    top10pct_share: float | None = None
    feature_names: tuple[str, ...] = ()
    sequence: bool = False  # an EmbeddingCollection's table: one output row per id, unpooled
    feature_processed: bool = False  # a FeatureProcessedEmbeddingBagCollection's: never split
    collection: str | None = None  # its collection's path in the profiled model, if recorded
    data_type: str = "fp32"  # its weights' type (TorchRec's DataType, lower case)
    # a virtual table of a split (`split_options`): the model table it is a part of, the share
    # of that table's split features whose batch-transform calls this part is charged, and the
    # share of its own pooled width the recombined output holds (summed parts: 1/parts)
    split_of: str | None = None
    routed_features: float = 0.0
    output_share: float = 1.0  # the share of its pooled width that the model's output counts
    # a hot/cold split's cold part: its table's hottest `head_rows` rows (`head_share` of its
    # ids) are the hot part's, and this part draws from the law past them
    head_rows: int = 0
    head_share: float = 0.0

    @property
    def weight_bytes(self) -> float:
        """Bytes an element of its weights takes (`plans.types.WEIGHT_BYTES`)."""
        return WEIGHT_BYTES[self.data_type]

    def unique(self, draws: float) -> float:
        """Expected distinct rows among `draws` of its ids (`kernels.expected_unique`; past the
        head rows for a cold part, `kernels.expected_unique_past`)."""
        if self.head_rows:
            return expected_unique_past(
                self.num_embeddings, self.zipf_alpha, draws, self.head_rows, self.head_share
            )
        return expected_unique(self.num_embeddings, self.zipf_alpha, draws)

    def hot_share(self, fraction: float) -> float:
        """Share of accesses that hit the hottest `fraction` of rows (what a cache of that size
        catches): a power law through the measured top-1 % and top-10 % shares where both were
        measured, else the Zipf law of `zipf_alpha`."""
        fraction = min(max(fraction, 0.0), 1.0)
        if fraction >= 1.0:
            return 1.0
        if self.top1pct_share is not None and self.top10pct_share is not None:
            # power law through the two measured points: share = s1 * (fraction / 0.01) ** k
            s1, s10 = (
                max(self.top1pct_share, 1e-9),
                max(self.top10pct_share, self.top1pct_share, 1e-9),
            )
            k = math.log10(s10 / s1)
            return min(1.0, s1 * (fraction / 0.01) ** k)
        return zipf_share(self.num_embeddings, self.zipf_alpha, fraction)


def stats_from_spec(spec: WorkloadSpec) -> list[TableStats]:
    """The tables of a workload spec, as its generator draws them (what-if planning).

    Raises:
        UserError: the workload has no tables.
    """
    if not spec.tables:
        raise UserError(f"{spec.source or spec.name}: the workload has no tables")
    return [
        TableStats(
            name=t.name,
            num_embeddings=t.num_embeddings,
            embedding_dim=t.embedding_dim,
            ids_per_sample=t.pooling_factor * len(t.features),
            zipf_alpha=t.zipf_alpha,
            feature_names=tuple(t.features),
            sequence=t.sequence,
            collection=sequence_collection(t.embedding_dim) if t.sequence else None,
            data_type=t.data_type,
        )
        for t in spec.tables
    ]


# access_stats.parquet's columns planning cannot do without
REQUIRED = ("table", "num_embeddings", "embedding_dim", "batch_size", "ids")
# its numeric columns read here → (least value, most value or None); those not REQUIRED may be
# null
VALUE_RANGES: dict[str, tuple[float, float | None]] = {
    "num_embeddings": (1, None),
    "embedding_dim": (1, None),
    "batch_size": (1, None),
    "ids": (0, None),
    "zipf_alpha": (0, None),
    "top1pct_share": (0, 1),
    "top10pct_share": (0, 1),
}


def stats_from_profile(profile_dir: str | Path) -> tuple[list[TableStats], int]:
    """Tables as profiled (capped sizes) and the per-rank batch size, from access_stats.parquet."""
    import pandas as pd

    path = Path(profile_dir, "access_stats.parquet")
    if not path.is_file():
        raise UserError(
            f"{profile_dir}: no access_stats.parquet (run `sparselift profile` to make a profile)"
        )
    try:
        df = pd.read_parquet(path)
    except Exception as e:  # any unreadable parquet is bad input, whatever pyarrow raises
        raise UserError(f"{path}: unreadable Parquet ({e.__class__.__name__})") from None
    missing = sorted(set(REQUIRED) - set(df.columns))
    if missing or df.empty:
        raise UserError(
            f"{path}: missing columns {', '.join(missing)}" if missing else f"{path}: no rows"
        )
    _check_values(df, path)
    manifest = _manifest(Path(profile_dir))
    features, sequence, processed = _manifest_tables(manifest)
    collections = _collections(manifest)
    data_types = {
        t["name"]: t["data_type"]
        for t in manifest.get("tables") or []
        if isinstance(t, dict) and "data_type" in t
    }
    unknown = {n: d for n, d in data_types.items() if d not in WEIGHT_BYTES}
    if unknown:
        name, dt = next(iter(unknown.items()))
        raise UserError(
            f"{profile_dir}: table {name!r} holds weights of type {dt!r}, which SparseLift does "
            f"not know (known: {', '.join(WEIGHT_BYTES)})"
        )
    out = []
    order = list(dict.fromkeys(df["table"]))
    for name in order:
        g = df[df["table"] == name]
        batch = float(g["batch_size"].median())
        ids_per_sample = float(g["ids"].mean()) / max(batch, 1.0)

        def col(c: str, g: pd.DataFrame = g) -> float | None:
            return float(g[c].mean()) if c in g and g[c].notna().any() else None

        out.append(
            TableStats(
                name=str(name),
                num_embeddings=int(g["num_embeddings"].iloc[0]),
                embedding_dim=int(g["embedding_dim"].iloc[0]),
                ids_per_sample=max(ids_per_sample, 1e-6),
                zipf_alpha=col("zipf_alpha") or 0.0,
                top1pct_share=col("top1pct_share"),
                top10pct_share=col("top10pct_share"),
                feature_names=tuple(features.get(str(name), (str(name),))),
                sequence=str(name) in sequence,
                feature_processed=str(name) in processed,
                collection=collections.get(str(name)),
                data_type=data_types.get(str(name), "fp32"),
            )
        )
    return out, int(df["batch_size"].median())


def _check_values(df: Any, path: Path) -> None:
    """Refuse a value no profiler writes (a hand-edited or damaged file): each of
    `VALUE_RANGES`' columns present holds finite numbers in its range (shares may be null).

    Raises:
        UserError: naming the file, the column, a table that holds the value, and the value.
    """
    import pandas as pd

    for c, (low, high) in VALUE_RANGES.items():
        if c not in df:
            continue
        v = pd.to_numeric(df[c], errors="coerce").astype(float)
        nullable = c not in REQUIRED
        ok = v.between(low, high if high is not None else float("inf")) & v.abs().lt(float("inf"))
        bad = ~(ok | (v.isna() & df[c].isna() & nullable))
        if bad.any():
            i = int(bad.to_numpy().argmax())
            value = df[c].iloc[i]
            value = value.item() if hasattr(value, "item") else value  # numpy → Python
            span = f"{low:g}..{high:g}" if high is not None else f">= {low:g}"
            raise UserError(
                f"{path}: column {c!r} of table {df['table'].iloc[i]!r} holds {value!r}, "
                f"not a finite number {span}"
            )


def _manifest(profile_dir: Path) -> dict[str, Any]:
    """manifest.json's object, or {} where it cannot be read (the statistics stand alone)."""
    try:
        m = json.loads((profile_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return m if isinstance(m, dict) else {}


def _collections(m: dict[str, Any]) -> dict[str, str]:
    """Each table's collection path as the profiled plan in force sharded it (a manifest's
    `sharding`); {} where not recorded. (Planning reads profiles without splits.)"""
    entries = m.get("sharding")
    return {
        str(e["table"]): str(e["module"])
        for e in (entries if isinstance(entries, list) else [])
        if isinstance(e, dict)
        and isinstance(e.get("table"), str)
        and isinstance(e.get("module"), str)
    }


def _manifest_tables(m: dict[str, Any]) -> tuple[dict[str, list[str]], set[str], set[str]]:
    """Feature names per table from a manifest that lists the model's tables (a list of names;
    anything else, or no manifest, gives the table's own name), the tables it records as
    unpooled (`pooling_type` "NONE": an EmbeddingCollection's) and those it records as
    feature-processed."""
    model, workload = m.get("model"), m.get("workload")  # a manifest's workload is its name
    tables = (
        (model.get("tables") if isinstance(model, dict) else None)
        or m.get("tables")
        or (workload.get("tables") if isinstance(workload, dict) else None)
        or []
    )
    out, sequence, processed = {}, set(), set()
    for t in tables if isinstance(tables, list) else []:
        if isinstance(t, dict) and isinstance(t.get("name"), str):
            names = t.get("feature_names")
            if isinstance(names, list) and names and all(isinstance(f, str) for f in names):
                out[t["name"]] = list(names)
            else:
                out[t["name"]] = [t["name"]]
            if is_sequence_table(t):
                sequence.add(t["name"])
            if t.get("feature_processed") is True:
                processed.add(t["name"])
    return out, sequence, processed
