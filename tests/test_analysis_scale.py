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

import numpy as np
import pandas as pd
import pytest

from sparselift.analysis import trace as T
from sparselift.analysis.ordered import ordered_sums
from sparselift.analysis.pipeline import OUTPUTS, analyze, merge_ranks, write_outputs
from sparselift.analysis.profile import load_profile, worker_count
from sparselift.analysis.rankwork import load_ranks
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


def _replicated(src: Path, dst: Path, n: int) -> Path:
    """`src`'s profile as if it had run on `n` ranks: rank r's trace is rank (r mod world)'s,
    renumbered (its collectives then pair across all n)."""
    dst.mkdir(parents=True)
    m = json.loads((src / "manifest.json").read_text())
    k = m["world_size"]
    for r in range(n):
        doc = json.loads(gzip.decompress((src / f"rank{r % k}.trace.json.gz").read_bytes()))
        doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": n}
        (dst / f"rank{r}.trace.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    shutil.copy(src / "access_stats.parquet", dst)
    m["world_size"] = n
    m["step_times_s"] = [m["step_times_s"][r % k] for r in range(n)]
    m["files"]["traces"] = [f"rank{r}.trace.json.gz" for r in range(n)]
    (dst / "manifest.json").write_text(json.dumps(m))
    return dst


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory) -> Path:
    return _replicated(FIX / "profile_tiny_row_wise", tmp_path_factory.mktemp("p8") / "p", 8)


def _calibration(a) -> dict:
    d = json.loads(a.calibration.to_bytes())
    d["provenance"].pop("created_unix")
    return d


def test_ordered_sums_add_each_group_as_numpy_adds_it():
    """Group sizes past numpy's 8-way unrolling and its 128-element blocks, values spanning
    magnitudes (where the order of additions shows in the last bit)."""
    rng = np.random.default_rng(0)
    sizes = [1, 2, 3, 7, 8, 9, 16, 17, 127, 128, 129, 300, 1000]
    codes = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    values = rng.random(len(codes)) * 10.0 ** rng.uniform(-9, 3, len(codes))
    got = ordered_sums(values, codes, len(sizes) + 1)  # the last group has no rows
    want = [np.sum(values[codes == g]) for g in range(len(sizes))]
    assert got.tolist() == [*want, 0.0]
    assert got[:-1].tolist() == [pd.Series(values[codes == g]).sum() for g in range(len(sizes))]
    assert ordered_sums(np.array([1.0, 2.0, 4.0]), np.array([0, -1, 0]), 2).tolist() == [5.0, 0.0]


def test_eight_ranks_merged_from_per_rank_results(eight_ranks, tmp_path):
    """Everything that compares ranks is made after the workers, from their results: the same
    whatever the number of workers, and as the contract defines it across all eight ranks."""
    one, par = analyze(eight_ranks, cache=False, workers=1), analyze(eight_ranks, workers=3)
    write_outputs(one, tmp_path / "one")
    write_outputs(par, tmp_path / "par")
    for name in ("nodes.parquet", "edges.parquet", "summary.parquet"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "par" / name).read_bytes()
    assert _calibration(one) == _calibration(par)
    pd.testing.assert_frame_equal(one.critical_path, par.critical_path)
    pd.testing.assert_frame_equal(one.evidence.calls, par.evidence.calls)
    n, s = par.nodes, par.summary
    assert sorted(n["rank"].unique()) == list(range(8)) and not par.unplaced
    coll = n[n["part"] == "collective"].set_index("node_id")
    peers = par.edges[par.edges["kind"] == "peer"]
    assert len(peers) == 7 * coll["coll_key"].nunique()
    src, dst = coll.loc[peers["src"]], coll.loc[peers["dst"]]
    assert (src["coll_key"].values == dst["coll_key"].values).all()
    assert (dst["rank"].values == src["rank"].values + 1).all()  # a chain in rank order
    for _, g in coll.groupby("coll_key"):
        assert (g["transfer_s"] == g["dur_s"].min()).all()
        assert (g["skew_s"] == g["dur_s"] - g["dur_s"].min()).all()
    by_step = s.groupby("step")["step_s"]
    assert np.allclose(s["imbalance_step"], by_step.transform("max") / by_step.transform("mean"))
    slowest = s.loc[by_step.idxmax()].set_index("step")["rank"]
    cp = par.critical_path
    assert len(cp) and (cp["rank"].values == slowest.loc[cp["step"]].values).all()


def test_the_analysing_process_holds_no_events(eight_ranks):
    """With workers, this process receives each rank's compact results only: its heap's peak
    stays well under what the ranks' parsed events take (which one process held before)."""
    events = sum(
        T.parse_trace_file(p).events.memory_usage(deep=True).sum()
        for p in sorted(eight_ranks.glob("rank*.trace.json.gz"))
    )
    tracemalloc.start()
    try:
        a = analyze(eight_ranks, cache=False, workers=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(a.nodes) and peak < 0.5 * events, (peak, events)


def test_a_share_its_worker_could_not_make_is_made_here(tmp_path):
    """A rank whose worker returned no share or samples (its error is raised where one process
    would raise it) gets them made again here, from its trace: the same analysis."""
    d = FIX / "profile_tiny_table_wise"
    whole = merge_ranks(load_ranks(d, cache=False, workers=2), d)
    run = load_ranks(d, cache=False, workers=2)
    run.results[1].share, run.results[1].calls = None, None
    again = merge_ranks(run, d)
    write_outputs(whole, tmp_path / "whole")
    write_outputs(again, tmp_path / "again")
    for name in ("nodes.parquet", "edges.parquet", "summary.parquet"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    assert _calibration(whole) == _calibration(again)
