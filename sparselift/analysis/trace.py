"""Kineto / Chrome traces → one pandas DataFrame of complete events per rank.

Parsing a trace is the slow part of analysis, so each trace is parsed once and cached as Parquet
beside the profile (or not at all when that directory is read-only). CPU traces (cpu_op,
user_annotation, gloo threads) and CUDA traces (kernel, gpu_memcpy, cuda_runtime with correlation
ids and streams) land in the same columns.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from sparselift.atomic import parquet_bytes, write_bytes, write_json
from sparselift.errors import UserError

CACHE_DIR = ".sparselift-cache"
CACHE_VERSION = 1
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
DERIVED_COLUMNS = ("thread", "end")  # of COLUMNS: computed after parsing, not read per event
COLUMNS = [
    "name",
    "cat",
    "pid",
    "tid",
    "thread",
    "ts",
    "dur",
    "end",
    "ext_id",
    "correlation",
    "seq",
    "stream",
    "device",
    "input_dims",
    "input_types",
    "bytes",
]


@dataclass
class Trace:
    """One rank's events plus the trace-level metadata used for consistency checks."""

    path: str
    rank: int | None  # from distributedInfo
    world_size: int | None
    events: pd.DataFrame  # COLUMNS; ts/dur/end in microseconds
    meta: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def is_cuda(self) -> bool:
        """Whether the trace has device (GPU) events."""
        return bool(self.events["cat"].isin(GPU_CATS).any())


def read_json(path: Path) -> Any:
    """The trace document; corrupt gzip or non-JSON becomes a one-line UserError naming the file."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise UserError(
            f"{path}: truncated or corrupt gzip ({e.__class__.__name__}: {e})"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(
            f"{path}: not a Kineto trace: not valid JSON ({e.__class__.__name__})"
        ) from None


def parse_trace(doc: Any, path: str) -> Trace:
    """A decoded trace document as a `Trace` (complete events only, sorted by start).

    Args:
        doc: the decoded JSON.
        path: the file it came from, for messages and `Trace.path`.
    Raises:
        UserError: it is not a Kineto/Chrome trace (no `traceEvents` list).
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise UserError(f"{path}: not a Kineto trace: no 'traceEvents' list")
    thread_names: dict[tuple[Any, Any], str] = {}
    rows = []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            thread_names[(str(e.get("pid")), str(e.get("tid")))] = str(
                (e.get("args") or {}).get("name", "")
            )
            continue
        if ph != "X" or "ts" not in e:
            continue
        a = e.get("args") or {}
        cat = e.get("cat", "")
        dims = a.get("Input Dims")
        types = a.get("Input type")
        rows.append(
            (
                str(e.get("name", "")),
                str(cat),
                str(e.get("pid")),
                str(e.get("tid")),
                float(e["ts"]),
                float(e.get("dur", 0.0)),
                _int(a.get("External id", a.get("external id"))),
                _int(a.get("correlation")),
                _int(a.get("Sequence number")),
                _int(a.get("stream")),
                _int(a.get("device")),
                json.dumps(dims) if dims is not None else "",
                json.dumps(types) if types is not None else "",
                _int(a.get("bytes")),
            )
        )
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in DERIVED_COLUMNS])
    for c in ("ext_id", "correlation", "seq", "stream", "device", "bytes"):
        df[c] = df[c].astype("Int64")
    df["thread"] = [thread_names.get((p, t), "") for p, t in zip(df["pid"], df["tid"], strict=True)]
    df["end"] = df["ts"] + df["dur"]
    df = (
        df[COLUMNS]
        .sort_values(["ts", "end"], ascending=[True, False], kind="stable")
        .reset_index(drop=True)
    )
    info = doc.get("distributedInfo") or {}
    meta = {
        k: doc.get(k) for k in ("trace_id", "baseTimeNanoseconds", "schemaVersion", "host_name")
    }
    meta["distributedInfo"] = info
    meta["deviceProperties"] = doc.get("deviceProperties") or []
    return Trace(
        path=path,
        rank=_int(info.get("rank")),
        world_size=_int(info.get("world_size")),
        events=df,
        meta=meta,
    )


def load_trace(path: str | Path, cache: bool = True) -> Trace:
    """One rank's trace, parsed once: later calls read the Parquet cache beside it.

    The cache is used only while the trace's size and mtime are unchanged; a broken cache is
    parsed again.

    Args:
        path: a Kineto trace (.json or .json.gz).
        cache: read and write the cache (a read-only directory just means no cache).
    Raises:
        UserError: the file is missing, corrupt, not JSON, or not a Kineto trace.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: trace file missing")
    st = path.stat()
    key = {"v": CACHE_VERSION, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cdir = path.parent / CACHE_DIR
    cfile, mfile = cdir / f"{path.name}.parquet", cdir / f"{path.name}.meta.json"
    if cache and cfile.is_file() and mfile.is_file():
        try:
            m = json.loads(mfile.read_text())
            if m.get("key") == key:
                return Trace(
                    path=str(path),
                    rank=m["rank"],
                    world_size=m["world_size"],
                    events=pd.read_parquet(cfile),
                    meta=m["meta"],
                )
        except Exception:  # a broken cache, whatever is wrong with it, is re-parsed, never trusted
            pass
    tr = parse_trace(read_json(path), str(path))
    if cache:
        _write_cache(tr, key, cdir, cfile, mfile)
    return tr


def _write_cache(tr: Trace, key: dict, cdir: Path, cfile: Path, mfile: Path) -> None:
    """Best effort: a read-only profile directory just means no cache."""
    try:
        cdir.mkdir(exist_ok=True)
        write_bytes(cfile, parquet_bytes(tr.events))
        write_json(
            mfile, {"key": key, "rank": tr.rank, "world_size": tr.world_size, "meta": tr.meta}
        )
    except OSError:
        pass


def _int(v: Any) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def dims_of(s: str) -> list:
    """The recorded `Input Dims` of an event ([] when shapes were not recorded)."""
    return json.loads(s) if s else []
