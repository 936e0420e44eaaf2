"""Analysis at scale: the streaming trace parser and the parallel per-rank loading give exactly what
the whole-document parser and one process give, refuse the same bad input, and cost less memory.
Speed and memory at scale are measured in benchmarks/bench_analysis_scale.py, not here."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pandas as pd
import pytest

from sparselift.analysis import trace as T
from sparselift.analysis.pipeline import OUTPUTS, analyze, write_outputs
from sparselift.analysis.profile import load_profile, worker_count
from sparselift.cli import main
from sparselift.errors import UserError

FIX = Path(__file__).parent / "fixtures"
PROFILES = ["profile_tiny_row_wise", "profile_tiny_table_wise"]
RANK0 = FIX / "profile_tiny_row_wise" / "rank0.trace.json.gz"


def whole_document(path: Path) -> T.Trace:
    return T.parse_trace(T.read_json(path), str(path))


@pytest.mark.parametrize("chunk", [97, 1 << 20])
def test_streaming_parse_equals_the_whole_document_parse(monkeypatch, chunk):
    """Chunk ends fall inside keys, strings, numbers and events: nothing read differs (the small
    documents below are read a character at a time too)."""
    monkeypatch.setattr(T._Stream, "CHUNK", chunk)
    for name in PROFILES:
        for p in sorted((FIX / name).glob("rank*.trace.json.gz")):
            want, got = whole_document(p), T.parse_trace_file(p)
            pd.testing.assert_frame_equal(got.events, want.events)
            assert (got.rank, got.world_size, got.meta) == (want.rank, want.world_size, want.meta)
            assert len(got.events) > 1000


DOCS = {
    "empty": b"",
    "list": b"[1, 2]",
    "events-not-list": b'{"traceEvents": 5}',
    "extra-data": b'{"traceEvents": []} x',
    "truncated": b'{"traceEvents": [{"ph": "X", "ts": 1',
    "number-key": b'{5: 1, "traceEvents": []}',
    "trailing-comma": b'{"traceEvents": [{"ph": "X", "ts": 1,}]}',
    "last-key-wins": b'{"traceEvents": [], "traceEvents": 3}',
    "ok-empty": b' {"traceEvents": [ ]} ',
    "ok-late-meta": b'{"traceEvents": [{"ph": "X", "ts": 1.5, "dur": 2, "name": "a", '
    b'"args": {"External id": 3}}], "distributedInfo": {"rank": 1, "world_size": 2}, '
    b'"baseTimeNanoseconds": 1234567890123}',
    "not-utf8": b'{"traceEvents": [{"name": "\xff"}]}',
}


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("doc", sorted(DOCS))
def test_streaming_parse_refuses_what_the_whole_document_parse_refuses(
    tmp_path, monkeypatch, doc, gz, chunk
):
    monkeypatch.setattr(T._Stream, "CHUNK", chunk)
    p = tmp_path / (doc + (".json.gz" if gz else ".json"))
    p.write_bytes(gzip.compress(DOCS[doc]) if gz else DOCS[doc])

    def outcome(parse):
        try:
            tr = parse(p)
        except UserError as e:
            return ("refused", str(e))
        return ("parsed", tr.events.to_dict(), tr.meta, tr.rank)

    want = outcome(whole_document)
    assert outcome(T.parse_trace_file) == want
    assert (want[0] == "parsed") == doc.startswith("ok")


def test_truncated_gzip_is_named(tmp_path):
    p = tmp_path / "rank0.trace.json.gz"
    p.write_bytes(RANK0.read_bytes()[:-4000])
    with pytest.raises(UserError, match=r"rank0\.trace\.json\.gz: truncated or corrupt gzip"):
        T.parse_trace_file(p)


def test_streaming_holds_less_than_the_decoded_document():
    """The Python heap's peak while parsing, streaming vs decoding the whole document."""

    def peak(parse) -> int:
        tracemalloc.start()
        try:
            parse(RANK0)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    whole, streamed = peak(whole_document), peak(T.parse_trace_file)
    assert streamed < 0.6 * whole, (streamed, whole)


def _outputs(d: Path, out: Path, workers: int, cache: bool) -> dict[str, bytes]:
    a = analyze(d, cache=cache, workers=workers)
    write_outputs(a, out)
    return {n: (out / n).read_bytes() for n in OUTPUTS if n.endswith(".parquet")}


@pytest.mark.parametrize("name", PROFILES)
def test_parallel_analysis_is_byte_identical_to_one_worker(tmp_path, name):
    d = tmp_path / name
    shutil.copytree(FIX / name, d)
    one = _outputs(d, tmp_path / "one", 1, cache=False)
    assert _outputs(d, tmp_path / "cold", 2, cache=True) == one  # workers write the cache
    assert len(list((d / T.CACHE_DIR).glob("*.parquet"))) == 2
    assert _outputs(d, tmp_path / "warm", 2, cache=True) == one  # and read it
    assert set(one) == {"nodes.parquet", "edges.parquet", "summary.parquet"}


def test_worker_count():
    assert worker_count(2, 8) == 2  # never more than ranks
    assert worker_count(8, 3) == 3
    assert 1 <= worker_count(1000) <= 1000
    with pytest.raises(UserError, match="workers must be at least 1"):
        worker_count(4, 0)


def test_a_bad_rank_fails_in_rank_order_with_workers(tmp_path):
    d = tmp_path / "p"
    shutil.copytree(FIX / "profile_tiny_table_wise", d)
    (d / "rank1.trace.json.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(UserError, match=r"rank1\.trace\.json\.gz: truncated or corrupt gzip"):
        load_profile(d, cache=False, workers=2)
    shutil.copy(d / "rank0.trace.json.gz", d / "rank1.trace.json.gz")
    with pytest.raises(UserError, match=r"rank1\.trace\.json\.gz: is rank 0's trace"):
        load_profile(d, cache=False, workers=2)


def test_load_profile_reports_what_parsing_cost(tmp_path):
    lines: list[str] = []
    prof = load_profile(
        FIX / "profile_tiny_row_wise", cache=False, progress=lines.append, workers=2
    )
    st = prof.parse
    assert st is not None and st.ranks == 2 and st.workers == 2
    assert st.wall_s > 0 and st.peak_rss_mib > 10 and st.worker_peak_rss_mib
    assert st.trace_mib == pytest.approx(
        sum(p.stat().st_size for p in (FIX / "profile_tiny_row_wise").glob("rank*.gz")) / 2**20
    )
    assert lines[-1] == st.line() and "2 workers" in lines[-1]
    assert all(tr.rank_nodes is not None for tr in prof.traces)


def test_analyze_cli_prints_the_parse_line(tmp_path, capsys):
    d = tmp_path / "p"
    shutil.copytree(FIX / "profile_tiny_row_wise", d)
    assert main(["analyze", str(d), "--workers", "2", "--no-cache"]) == 0
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if ln.startswith("parsed 2 traces")]
    assert len(line) == 1 and "with 2 workers; peak RSS" in line[0]


@pytest.mark.slow
def test_benchmark_quick_runs(tmp_path):
    """The benchmark end to end at --quick: real profiles, its table and the extrapolation."""
    bench = Path(__file__).parents[1] / "benchmarks" / "bench_analysis_scale.py"
    r = subprocess.run(
        [sys.executable, str(bench), "--quick", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    assert "MB/s/core" in r.stdout and "extrapolated to 128 ranks x 50 MB" in r.stdout
    assert "streaming (parse_trace_file)" in r.stdout


def _without_rank1(tmp_path: Path) -> Path:
    d = tmp_path / "gone"
    shutil.copytree(FIX / "profile_tiny_table_wise", d)
    (d / "rank1.trace.json.gz").unlink()
    m = json.loads((d / "manifest.json").read_text())
    m["missing_ranks"] = [1]
    m["files"]["traces"] = m["files"]["traces"][:1]
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def test_a_missing_rank_is_refused_unless_allowed(tmp_path, capsys):
    d = _without_rank1(tmp_path)
    assert main(["analyze", str(d), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rank(s) 1" in err[0] and "--allow-missing-ranks" in err[0]
    assert not (tmp_path / "o").exists()
    a = analyze(d, cache=False, allow_missing_ranks=True)
    assert set(a.nodes["rank"]) == {0} and set(a.steps["rank"]) == {0}
    assert a.calibration.provenance.manifest["missing_ranks"] == [1]
    assert main(["analyze", str(d), "--out", str(tmp_path / "o"), "--allow-missing-ranks"]) == 0
