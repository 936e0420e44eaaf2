"""Kineto / Chrome traces → one pandas DataFrame of complete events per rank.

Parsing a trace is the slow part of analysis, so each trace is parsed once and cached as Parquet
beside the profile (or not at all when that directory is read-only). CPU traces (cpu_op,
user_annotation, gloo threads) and CUDA traces (kernel, gpu_memcpy, cuda_runtime with correlation
ids and streams) land in the same columns.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
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
    # (rank, reconstruct.RankNodes) made where the trace was parsed (`profile.load_profile`'s
    # workers), which `reconstruct.build_graph` uses instead of making them again; None: not made
    rank_nodes: Any = field(default=None, repr=False, compare=False)

    @cached_property
    def is_cuda(self) -> bool:
        """Whether the trace has device (GPU) events."""
        return bool(self.events["cat"].isin(GPU_CATS).any())


def read_json(path: Path) -> Any:
    """The trace document; corrupt gzip or non-JSON becomes a one-line UserError naming the file.

    Decodes the whole document at once (several times the file's size in memory); `load_trace`
    streams instead (`parse_trace_file`). Kept for callers that want the document itself.
    """
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json.loads(raw)
    except _GZIP_ERRORS as e:
        raise _gzip_error(path, e) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _json_error(path, e) from None


_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error, OSError)


def _gzip_error(path: Path, e: Exception) -> UserError:
    return UserError(f"{path}: truncated or corrupt gzip ({e.__class__.__name__}: {e})")


def _json_error(path: Path, e: Exception) -> UserError:
    return UserError(f"{path}: not a Kineto trace: not valid JSON ({e.__class__.__name__})")


class _Rows:
    """Complete events and thread names, accumulated one event at a time, as columns.

    Only the fields `COLUMNS` needs are kept, and repeated strings share one object, so what is
    held grows with the number of events, not with the size of their JSON.
    """

    def __init__(self) -> None:
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.cols: list[list[Any]] = [[] for _ in _PARSED]
        self._strings: dict[str, str] = {}

    def _s(self, v: str) -> str:
        return self._strings.setdefault(v, v)

    def add(self, e: Any) -> None:
        """Keep `e` if it is a complete event ("X" with a ts) or a thread_name record."""
        if not isinstance(e, dict):
            return
        ph = e.get("ph")
        if ph == "M" and e.get("name") == "thread_name":
            self.thread_names[(str(e.get("pid")), str(e.get("tid")))] = str(
                (e.get("args") or {}).get("name", "")
            )
            return
        if ph != "X" or "ts" not in e:
            return
        a = e.get("args") or {}
        dims = a.get("Input Dims")
        types = a.get("Input type")
        s = self._s
        row = (
            s(str(e.get("name", ""))),
            s(str(e.get("cat", ""))),
            s(str(e.get("pid"))),
            s(str(e.get("tid"))),
            float(e["ts"]),
            float(e.get("dur", 0.0)),
            _int(a.get("External id", a.get("external id"))),
            _int(a.get("correlation")),
            _int(a.get("Sequence number")),
            _int(a.get("stream")),
            _int(a.get("device")),
            s(json.dumps(dims)) if dims is not None else "",
            s(json.dumps(types)) if types is not None else "",
            _int(a.get("bytes")),
        )
        for col, v in zip(self.cols, row, strict=True):
            col.append(v)

    def frame(self) -> pd.DataFrame:
        """The events as a DataFrame with `COLUMNS`, sorted by start (then longest first)."""
        df = pd.DataFrame(dict(zip(_PARSED, self.cols, strict=True)), columns=_PARSED)
        self.cols = []
        for c in ("ext_id", "correlation", "seq", "stream", "device", "bytes"):
            df[c] = df[c].astype("Int64")
        names = self.thread_names
        df["thread"] = [names.get((p, t), "") for p, t in zip(df["pid"], df["tid"], strict=True)]
        df["end"] = df["ts"] + df["dur"]
        return (
            df[COLUMNS]
            .sort_values(["ts", "end"], ascending=[True, False], kind="stable")
            .reset_index(drop=True)
        )


_PARSED = [c for c in COLUMNS if c not in DERIVED_COLUMNS]


def _make_trace(rows: _Rows, top: dict[str, Any], path: str) -> Trace:
    """The Trace of accumulated `rows` and the document's other top-level fields `top`."""
    info = top.get("distributedInfo") or {}
    meta = {
        k: top.get(k) for k in ("trace_id", "baseTimeNanoseconds", "schemaVersion", "host_name")
    }
    meta["distributedInfo"] = info
    meta["deviceProperties"] = top.get("deviceProperties") or []
    return Trace(
        path=path,
        rank=_int(info.get("rank")),
        world_size=_int(info.get("world_size")),
        events=rows.frame(),
        meta=meta,
    )


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
    rows = _Rows()
    for e in doc["traceEvents"]:
        rows.add(e)
    return _make_trace(rows, doc, path)


def parse_trace_file(path: Path) -> Trace:
    """The trace file `path` as a `Trace`, equal to `parse_trace(read_json(path), str(path))`.

    The file is decompressed and decoded a chunk at a time and each event is reduced to its row
    as soon as it is read, so memory holds the rows, never the whole document.

    Raises:
        UserError: corrupt gzip, not JSON, or not a Kineto trace (no `traceEvents` list).
    """
    try:
        with path.open("rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        f = gzip.open(path, "rb") if gz else path.open("rb")
        with io.TextIOWrapper(f, encoding="utf-8-sig", errors="surrogatepass") as text:
            return _parse_stream(_Stream(text), str(path))
    except _GZIP_ERRORS as e:
        raise _gzip_error(path, e) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _json_error(path, e) from None


def _parse_stream(st: _Stream, path: str) -> Trace:
    """Walk the top-level object: traceEvents event by event, any other field whole."""
    no_events = UserError(f"{path}: not a Kineto trace: no 'traceEvents' list")
    if st.peek() != "{":
        st.value()  # a JSON document that is not an object: decode it to tell bad JSON apart
        st.end()
        raise no_events
    st.take("{")
    top: dict[str, Any] = {}
    rows: _Rows | None = None
    if st.peek() == "}":
        st.take("}")
    else:
        while True:
            if st.peek() != '"':
                raise json.JSONDecodeError("Expecting property name", st.buf, st.i)
            key = st.value()
            st.take(":")
            if key == "traceEvents" and st.peek() == "[":
                rows = _Rows()
                top.pop(key, None)
                for e in st.array():
                    rows.add(e)
            else:
                top[key] = st.value()
                if key == "traceEvents":
                    rows = None
            if st.take(",}") == "}":
                break
    st.end()
    if rows is None:
        raise no_events
    return _make_trace(rows, top, path)


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Stream:
    """A JSON text read a chunk at a time, decoded one value (or one array element) at a time.

    Errors are `json.JSONDecodeError`, as `json.loads` raises on the same text.
    """

    CHUNK = 1 << 20

    def __init__(self, f: io.TextIOBase) -> None:
        self.f, self.buf, self.i, self.eof = f, "", 0, False

    def _more(self) -> bool:
        data = self.f.read(self.CHUNK)
        if not data:
            self.eof = True
            return False
        self.buf, self.i = self.buf[self.i :] + data, 0
        return True

    def peek(self) -> str:
        """The next character that is not whitespace ("" at the end), not consumed."""
        while True:
            self.i = _WS.match(self.buf, self.i).end()  # type: ignore[union-attr]
            if self.i < len(self.buf) or not self._more():
                return self.buf[self.i : self.i + 1]

    def take(self, allowed: str) -> str:
        """Consume the next character, which must be one of `allowed`; return it."""
        c = self.peek()
        if not c or c not in allowed:
            raise json.JSONDecodeError(f"Expecting one of {allowed!r}", self.buf, self.i)
        self.i += 1
        return c

    def value(self) -> Any:
        """Decode the next whole value (reading on while it may be cut off by the chunk end)."""
        self.peek()
        while True:
            try:
                v, j = _DECODER.raw_decode(self.buf, self.i)
            except json.JSONDecodeError:
                if self._more():
                    continue
                raise
            # a value that ends where the text read so far ends may be a number cut short: read
            # on and decode it again (`_more` leaves buf as it is when there is no more)
            if j < len(self.buf) or self.eof or not self._more():
                self.i = j
                return v

    def array(self) -> Iterator[Any]:
        """Yield the elements of the array that starts here, one at a time."""
        self.take("[")
        if self.peek() == "]":
            self.i += 1
            return
        while True:
            yield self.value()
            if self.take(",]") == "]":
                return

    def end(self) -> None:
        """Require nothing but whitespace to follow (json.loads refuses "Extra data")."""
        if self.peek():
            raise json.JSONDecodeError("Extra data", self.buf, self.i)


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
    tr = parse_trace_file(path)
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
