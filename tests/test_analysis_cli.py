"""`sparselift analyze`: outputs on a good profile; bad input: exit 2, one line, nothing written."""

import gzip
import json
import shutil
from pathlib import Path

import pytest

from sparselift.analysis.pipeline import OUTPUTS
from sparselift.cli import main

FIX = Path(__file__).parent / "fixtures"
TW, RW = FIX / "profile_tiny_table_wise", FIX / "profile_tiny_row_wise"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".sparselift-cache"))
    return dst


def test_analyze_writes_outputs(tmp_path, capsys):
    prof = _copy(TW, tmp_path / "p")
    assert main(["analyze", str(prof), "--out", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(OUTPUTS)
    out = capsys.readouterr().out
    assert "sparse_compute" in out and "critical sparse path" in out
    cache = prof / ".sparselift-cache"
    assert cache.is_dir()  # parsed once, cached beside the profile
    stamps = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert main(["analyze", str(prof), "--out", str(tmp_path / "out2")]) == 0  # from the cache
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == stamps  # read, not rewritten
    for name in ("nodes.parquet", "edges.parquet", "summary.parquet"):  # the same graph either way
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes(), (
            name
        )


def _truncate(p: Path):
    f = p / "rank1.trace.json.gz"
    f.write_bytes(f.read_bytes()[:5000])
    return "rank1.trace.json.gz: truncated or corrupt gzip"


def _not_trace(p: Path):
    (p / "rank0.trace.json.gz").write_bytes(gzip.compress(json.dumps({"hello": 1}).encode()))
    return "rank0.trace.json.gz: not a Kineto trace"


def _garbage(p: Path):
    (p / "rank0.trace.json.gz").write_bytes(b"\x1f\x8bnot really gzip")
    return "rank0.trace.json.gz: truncated or corrupt gzip"


def _missing(p: Path):
    (p / "rank1.trace.json.gz").unlink()
    return "rank1.trace.json.gz: missing — rank 1's trace (manifest says world size 2)"


def _mixed(p: Path):
    shutil.copy(RW / "rank1.trace.json.gz", p / "rank1.trace.json.gz")
    return "different runs"


def _no_sparse(p: Path):
    f = p / "rank0.trace.json.gz"
    d = json.loads(gzip.decompress(f.read_bytes()))
    d["traceEvents"] = [
        e
        for e in d["traceEvents"]
        if e.get("name", "").startswith("ProfilerStep") or e.get("ph") == "M"
    ]
    f.write_bytes(gzip.compress(json.dumps(d).encode()))
    return "rank0.trace.json.gz: no sparse-path events"


def _no_manifest(p: Path):
    (p / "manifest.json").unlink()
    return "manifest.json: missing"


@pytest.mark.parametrize(
    "breaker", [_truncate, _not_trace, _garbage, _missing, _mixed, _no_sparse, _no_manifest]
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, breaker):
    prof = _copy(TW, tmp_path / "p")
    want = breaker(prof)
    before = sorted(p.name for p in prof.iterdir())
    out = tmp_path / "out"
    assert main(["analyze", str(prof), "--out", str(out), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and want in err, err
    assert not out.exists()
    assert sorted(p.name for p in prof.iterdir()) == before
    # in place (no --out): nothing partial lands in the profile either
    assert main(["analyze", str(prof), "--no-cache"]) == 2
    assert sorted(p.name for p in prof.iterdir()) == before
