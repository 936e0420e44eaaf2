"""Bad input to every command: one line on stderr that names the bad thing, exit code 2, no file.

Each case runs `sparselift …` in-process on files made for it: a missing file, a directory where a
file belongs, malformed JSON, another format or version, numbers that are zero, negative, NaN or
huge, and outputs whose folder is missing or is a regular file. Every refusal must come before
any rank starts, so none of these cases trains.

A case is one line of a table: `id | argv | needle`. In argv and needle, `$NAME` stands for a part
of a command that many cases share (MACROS), `{name}` for a file `inputs` made.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from bad_input_cases import analyzed_fixture_profile, assert_refused, expand, rows
from plans_helpers import doc, round_robin

from sparselift import plans
from sparselift.workloads import load_workload

MACROS = {
    "$TRAIN": "--workload tiny --nproc 2",
    "$OPT": "optimize --workload tiny --no-baseline --time-limit 1",  # no waiting on TorchRec
    "$OUT": "--out {tmp}/plan.json",
    "$BENCH": "bench --workload tiny --nproc 2 --plan {rr}",
    "$BASE": "optimize --workload tiny --time-limit 1",  # with TorchRec's planner
    "$FT": "plan from-torchrec --workload tiny --world-size 2",
    "$NOTDIR": "is not a directory",
    "$CW": "cannot write",
    "$MISSING": "does not exist",
}

CASES = """
train-workload-missing | train --workload {tmp}/nope.json | nope.json
train-workload-dir | train --workload {adir} | {adir}
train-workload-malformed | train --workload {malformed} | malformed JSON
train-workload-not-object | train --workload {list} | {list}: a workload spec
train-workload-huge-rows | train --workload {huge} | {huge}: table 't2'
train-workload-float-rows | train --workload {floatrows} | 'num_embeddings' must be an
train-workload-nan-pooling | train --workload {nanpool} | pooling_factor must be
train-nproc-zero | train $TRAIN --nproc 0 | --nproc
train-nproc-negative | train $TRAIN --nproc -3 | --nproc
train-nproc-huge | train $TRAIN --nproc 1000000 | --nproc
train-nproc-not-int | train $TRAIN --nproc two | --nproc
train-steps-zero | train $TRAIN --steps 0 | --steps
train-steps-huge | train $TRAIN --steps 1000000000000 | --steps
train-steps-nan | train $TRAIN --steps nan | --steps
train-warmup-negative | train $TRAIN --warmup -1 | --warmup
train-max-rows-zero | train $TRAIN --max-rows 0 | --max-rows
train-max-rows-negative | train $TRAIN --max-rows -5 | --max-rows
train-batch-size-zero | train $TRAIN --batch-size 0 | --batch-size
train-batch-size-huge | train $TRAIN --batch-size 1099511627776 | --batch-size
train-seed-negative | train $TRAIN --seed -1 | --seed
train-data-missing | train $TRAIN --data {tmp}/nodata | nodata
train-data-file | train $TRAIN --data {blocker} | {blocker}
train-plan-missing | train $TRAIN --plan {tmp}/nope.json | nope.json
train-plan-dir | train $TRAIN --plan {adir} | {adir}
train-plan-malformed | train $TRAIN --plan {malformed} | malformed JSON
train-plan-other-format | train $TRAIN --plan {other} | not a SparseLift plan
train-plan-newer | train $TRAIN --plan {newer} | version 99 is newer
train-plan-other-world | train $TRAIN --nproc 4 --plan {rr} | plan is for world_size 2
train-json-missing-parent | train $TRAIN --json {tmp}/no/r.json | $CW {tmp}/no/r.json
train-json-file-parent | train $TRAIN --json {blocker}/r.json | {blocker} $NOTDIR
train-json-is-dir | train $TRAIN --json {adir} | $CW {adir}

profile-out-file-parent | profile $TRAIN --out {blocker}/p | {blocker} $NOTDIR
profile-out-is-file | profile $TRAIN --out {blocker} | {blocker}
profile-out-not-empty | profile $TRAIN --out {nonempty} | --force
profile-after-negative | profile $TRAIN --after -1 --out {tmp}/p | --after
profile-after-huge | profile $TRAIN --after 1000000000 --out {tmp}/p | --after
profile-steps-zero | profile $TRAIN --steps 0 --out {tmp}/p | --steps
profile-nproc-zero | profile $TRAIN --nproc 0 --out {tmp}/p | --nproc
profile-workload-huge-rows | profile --workload {huge} --out {tmp}/p | table 't2'
profile-plan-malformed | profile $TRAIN --plan {malformed} --out {tmp}/p | malformed JSON
profile-also-same-dir | profile $TRAIN --out {tmp}/p --also {rr} {tmp}/p | into the same directory
profile-also-rounds-zero | profile $TRAIN --out {tmp}/p --also {rr} {tmp}/q --rounds 0 | --rounds
profile-also-malformed | profile $TRAIN --out {tmp}/p --also {malformed} {tmp}/q | malformed JSON

analyze-dir-missing | analyze {tmp}/noprofile | noprofile
analyze-dir-is-file | analyze {blocker} | {blocker}
analyze-dir-empty | analyze {adir} | {adir}
analyze-manifest-malformed | analyze {badmanifest} | malformed JSON
analyze-manifest-other | analyze {othermanifest} | {othermanifest}
analyze-manifest-newer | analyze {newermanifest} | version
analyze-out-file-parent | analyze {prof} --out {blocker}/out | {blocker} $NOTDIR
analyze-out-is-file | analyze {prof} --out {blocker} | {blocker}
analyze-html-file-parent | analyze {prof} --out {tmp}/o --html {blocker}/r.html | {blocker} $NOTDIR
analyze-html-no-parent | analyze {prof} --out {tmp}/o --html {tmp}/no/r.html | $CW {tmp}/no/r.html
analyze-pipeline-profile-missing | analyze {prof} --out {tmp}/o --pipeline-profile {tmp}/nope | nope
analyze-pipeline-same | analyze {prof} --out {tmp}/o --pipeline-profile {prof} | SparseDist
analyze-workers-zero | analyze {prof} --out {tmp}/o --workers 0 | --workers
analyze-workers-negative | analyze {prof} --out {tmp}/o --workers -2 | --workers
analyze-workers-huge | analyze {prof} --out {tmp}/o --workers 1000000 | --workers

compare-baseline-missing | compare {tmp}/noprofile {prof} | noprofile
compare-candidate-is-file | compare {prof} {blocker} | {blocker}
compare-manifest-malformed | compare {prof} {badmanifest} | malformed JSON
compare-confidence-one | compare {prof} {prof} --confidence 1 | --confidence
compare-confidence-nan | compare {prof} {prof} --confidence nan | --confidence
compare-json-file-parent | compare {prof} {prof} --json {blocker}/v.json | {blocker} $NOTDIR

optimize-workload-huge-rows | $OPT --workload {huge} $OUT | {huge}: table 't2'
optimize-workload-missing | $OPT --workload {tmp}/nope.json $OUT | nope.json
optimize-workload-malformed | $OPT --workload {malformed} $OUT | malformed JSON
optimize-profile-missing | optimize --profile {tmp}/noprof $OUT | noprof
optimize-profile-is-file | optimize --profile {blocker} $OUT | {blocker}
optimize-profile-uncalibrated | optimize --profile {adir} $OUT | calibration
optimize-profile-bad-calibration | optimize --profile {badcal} $OUT | malformed JSON
optimize-calibration-missing | $OPT --calibration {tmp}/nope.json $OUT | nope.json
optimize-calibration-dir | $OPT --calibration {adir} $OUT | {adir}
optimize-calibration-malformed | $OPT --calibration {malformed} $OUT | malformed JSON
optimize-calibration-other | $OPT --calibration {other} $OUT | {other}
optimize-calibration-newer | $OPT --calibration {newercal} $OUT | version 99
optimize-calibration-unmeasured | $OPT --calibration {heldcal} $OUT | held_out[0].unmeasured
optimize-calibration-bound | $OPT --calibration {boundcal} $OUT | op 'dp_allreduce': bound
optimize-topology-missing | $OPT --topology {tmp}/nope.json $OUT | nope.json
optimize-topology-malformed | $OPT --topology {malformed} $OUT | malformed JSON
optimize-topology-other | $OPT --topology {other} $OUT | {other}
optimize-world-size-zero | $OPT --world-size 0 $OUT | world
optimize-world-size-negative | $OPT --world-size -2 $OUT | world
optimize-world-size-huge | $OPT --world-size 10000000 $OUT | world
optimize-local-world-size-zero | $OPT --local-world-size 0 $OUT | local
optimize-local-not-dividing | $OPT --world-size 2 --local-world-size 3 $OUT | local
optimize-device-unknown | $OPT --device tpu9000 $OUT | tpu9000
optimize-max-rows-zero | $OPT --max-rows 0 $OUT | --max-rows
optimize-batch-size-zero | $OPT --batch-size 0 $OUT | batch
optimize-batch-size-huge | $OPT --batch-size 1099511627776 $OUT | batch
optimize-time-limit-negative | $OPT --time-limit -1 $OUT | --time-limit
optimize-time-limit-nan | $OPT --time-limit nan $OUT | --time-limit
optimize-workers-zero | $OPT --workers 0 $OUT | --workers
optimize-workers-huge | $OPT --workers 1000000 $OUT | --workers
optimize-baseline-timeout-negative | $BASE --baseline-timeout -1 $OUT | --baseline-timeout
optimize-baseline-timeout-nan | $BASE --baseline-timeout nan $OUT | --baseline-timeout
optimize-min-gain-negative | $OPT --min-gain -0.5 $OUT | --min-gain
optimize-min-gain-nan | $OPT --min-gain nan $OUT | --min-gain
tune-min-gain-negative | tune $TRAIN --min-gain -0.5 $OUT | --min-gain
tune-min-gain-nan | tune $TRAIN --min-gain nan $OUT | --min-gain
optimize-out-file-parent | $OPT --out {blocker}/p.json | $CW {blocker}/p.json: {blocker} $NOTDIR
optimize-out-missing-parent | $OPT --out {tmp}/no/p.json | $CW {tmp}/no/p.json: {tmp}/no $MISSING
optimize-out-is-dir | $OPT --out {adir} | $CW {adir}: it is a directory
optimize-baseline-out-file-parent | $BASE $OUT --baseline-out {blocker}/tr.json | {blocker} $NOTDIR

plan-validate-world-size-zero | plan validate {rr} --world-size 0 | --world-size
plan-validate-world-size-huge | plan validate {rr} --world-size 10000000 | --world-size
plan-validate-max-rows-zero | plan validate {rr} --workload tiny --max-rows 0 | --max-rows
plan-validate-workload-huge | plan validate {rr} --workload {huge} | table 't2'
plan-diff-bench-missing | plan diff {rr} {rr} --bench {tmp}/nope.json | nope.json
plan-diff-bench-malformed | plan diff {rr} {rr} --bench {malformed} | malformed JSON
plan-diff-bench-other | plan diff {rr} {rr} --bench {other} | not a bench result
plan-diff-bench-no-contenders | plan diff {rr} {rr} --bench {newer} | not a bench result
plan-diff-html-file-parent | plan diff {rr} {rr} --html {blocker}/d.html | {blocker} $NOTDIR
plan-diff-html-no-parent | plan diff {rr} {rr} --html {tmp}/no/d.html | $CW {tmp}/no/d.html
plan-show-html-file-parent | plan show {rr} --html {blocker}/s.html | {blocker} $NOTDIR
plan-show-html-no-parent | plan show {rr} --html {tmp}/no/s.html | $CW {tmp}/no/s.html
plan-from-torchrec-batch-size-zero | $FT --batch-size 0 $OUT | --batch-size
plan-from-torchrec-batch-size-huge | $FT --batch-size 1099511627776 $OUT | --batch-size

bench-rounds-zero | $BENCH --rounds 0 | --rounds
bench-rounds-negative | $BENCH --rounds -2 | --rounds
bench-rounds-huge | $BENCH --rounds 1000000 | --rounds
bench-plan-missing | bench $TRAIN --plan {tmp}/nope.json | nope.json
bench-plan-malformed | bench $TRAIN --plan {malformed} | malformed JSON
bench-plan-newer | bench $TRAIN --plan {newer} | version 99 is newer
bench-nothing-to-measure | bench $TRAIN | nothing to measure
bench-nproc-zero | $BENCH --nproc 0 | --nproc
bench-steps-huge | $BENCH --steps 1000000000000 | --steps
bench-workload-huge | bench --workload {huge} --vs torchrec | table 't2'
bench-json-file-parent | $BENCH --json {blocker}/b.json | {blocker} $NOTDIR
bench-json-missing-parent | $BENCH --json {tmp}/no/b.json | $CW {tmp}/no/b.json

workloads-unknown-flag | workloads --bogus | --bogus
workloads-extra-argument | workloads --format tiny | tiny

plan-check-profile-missing | plan check {rr} --profile {tmp}/noprof | noprof/manifest.json
plan-check-profile-no-manifest | plan check {rr} --profile {adir} | {adir}/manifest.json: missing
plan-check-profile-bad-manifest | plan check {rr} --profile {badmanifest} | malformed JSON
plan-check-threshold-zero | plan check {rr} --profile {prof} --threshold 0 | --threshold
plan-check-threshold-negative | plan check {rr} --profile {prof} --threshold -1 | --threshold
plan-check-threshold-nan | plan check {rr} --profile {prof} --threshold nan | --threshold
plan-check-threshold-text | plan check {rr} --profile {prof} --threshold five | --threshold
plan-check-time-limit-zero | plan check {rr} --profile {prof} --time-limit 0 | --time-limit"""

# The plan file of every plan action, bad in each way.
PLAN_FILES = """
missing | {tmp}/nope.json | nope.json
dir | {adir} | {adir}: cannot read
malformed | {malformed} | malformed JSON
other-format | {other} | not a SparseLift plan
not-object | {list} | not a JSON object
newer | {newer} | version 99 is newer"""
PLAN_ACTIONS = {
    "show": "plan show",
    "validate": "plan validate",
    "diff": "plan diff {rr}",
    "check": "plan check --profile {prof}",
}

# The topology and output flags of both plan exports, bad in each way.
EXPORT_FLAGS = """
world-size-zero | --world-size 0 $OUT | --world-size
world-size-negative | --world-size -4 $OUT | --world-size
world-size-huge | --world-size 10000000 $OUT | --world-size
local-world-size-zero | --world-size 2 --local-world-size 0 $OUT | --local-world-size
local-not-dividing | --world-size 2 --local-world-size 3 $OUT | --local-world-size 3
device-unknown | --world-size 2 --device tpu $OUT | 'tpu'
max-rows-zero | --world-size 2 --max-rows 0 $OUT | --max-rows
out-file-parent | --world-size 2 --out {blocker}/p.json | $CW {blocker}/p.json: {blocker} $NOTDIR
out-missing-parent | --world-size 2 --out {tmp}/no/p.json | $CW {tmp}/no/p.json: {tmp}/no $MISSING
out-is-dir | --world-size 2 --out {adir} | $CW {adir}: it is a directory"""


def _all_cases() -> dict[str, tuple[str, str]]:
    """Every case: id → (argv with macros and {names}, needle)."""
    cases = {name: (argv, needle) for name, argv, needle in rows(CASES)}
    for kind, path, needle in rows(PLAN_FILES):
        for action, command in PLAN_ACTIONS.items():
            cases[f"plan-{action}-{kind}"] = (f"{command} {path}", needle)
    for action in ("from-torchrec", "round-robin"):
        for kind, flags, needle in rows(EXPORT_FLAGS):
            cases[f"plan-{action}-{kind}"] = (f"plan {action} --workload tiny {flags}", needle)
        for kind, workload, needle in (("huge", "{huge}", "'t2'"), ("dir", "{adir}", "{adir}")):
            argv = f"plan {action} --workload {workload} --world-size 2 $OUT"
            cases[f"plan-{action}-workload-{kind}"] = (argv, needle)
    return cases


KNOWN: dict[str, str] = {}  # cases that fail today, with what to fix; none now


def _spec(**table_changes: object) -> dict:
    d = load_workload("tiny").to_dict()
    d["tables"][2].update(table_changes)
    return d


@pytest.fixture(scope="module")
def analyzed_profile(tmp_path_factory) -> Path:
    """A real profile (tests/fixtures) analyzed once, so that it has its calibration.json."""
    return analyzed_fixture_profile(tmp_path_factory.mktemp("bad_input"))


@pytest.fixture
def inputs(tmp_path, analyzed_profile) -> dict[str, Path]:
    """The files the cases name, made in `tmp_path` (a name is its file's stem or folder)."""
    paths: dict[str, Path] = {"tmp": tmp_path, "prof": analyzed_profile}

    def put(name: str, content: object) -> None:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content if isinstance(content, str) else json.dumps(content))
        folder, _, _ = name.partition("/")
        paths[folder.removesuffix(".json")] = p if folder == name else p.parent

    plans.save(round_robin(2), tmp_path / "rr.json")
    paths["rr"] = tmp_path / "rr.json"
    (tmp_path / "adir").mkdir()
    paths["adir"] = tmp_path / "adir"
    put("blocker", "a regular file")
    put("malformed.json", '{"format": "sparselift-plan", ')
    put("other.json", {"format": "something-else", "version": 1})
    put("list.json", [1, 2])
    put("newer.json", {**doc(round_robin(2)), "version": 99})
    put("huge.json", _spec(num_embeddings=10**20))
    put("floatrows.json", _spec(num_embeddings=1e5))
    put("nanpool.json", json.dumps(_spec(pooling_factor=4.5)).replace("4.5", "NaN"))
    calibration = json.loads((analyzed_profile / "calibration.json").read_text())
    put("newercal.json", {**calibration, "version": 99})
    held = {"profile": "p", "measured_step_s": 1.0, "predicted_step_s": 1.1, "unmeasured": 5}
    put("heldcal.json", {**calibration, "held_out": [held]})
    bound = {**calibration["ops"]["lookup_fwd"], "bound": "yes"}
    put("boundcal.json", {**calibration, "ops": {**calibration["ops"], "dp_allreduce": bound}})
    put("badcal/calibration.json", "{")
    manifest = json.loads((analyzed_profile / "manifest.json").read_text())
    put("badmanifest/manifest.json", "{")
    put("othermanifest/manifest.json", {"format": "something-else", "version": 1})
    put("newermanifest/manifest.json", {**manifest, "version": 99})
    put("nonempty/stale.txt", "x")
    return paths


def _params() -> list:
    out = []
    for name, (argv, needle) in _all_cases().items():
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN[name])] if name in KNOWN else []
        out.append(pytest.param(argv, needle, id=name, marks=marks))
    return out


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("argv, needle", _params())
def test_bad_input_is_one_line_exit_2_and_writes_nothing(argv, needle, inputs, cli):
    args, needle = shlex.split(expand(argv, MACROS, inputs)), expand(needle, MACROS, inputs)
    before = _tree(inputs["tmp"])
    code, _, err = cli(*args)
    assert_refused(code, err, needle)
    assert _tree(inputs["tmp"]) == before, "a refused command left files behind"


def test_every_case_id_is_unique_and_every_known_failure_is_a_case():
    names = [row[0] for row in rows(CASES)]
    assert len(names) == len(set(names))
    assert set(KNOWN) <= set(_all_cases())


def test_both_atomic_writers_refuse_alike(tmp_path):
    """`sparselift.atomic` and the plans package's own copy give the same one-line refusals."""
    from sparselift.atomic import write_bytes
    from sparselift.errors import UserError
    from sparselift.plans import PlanWriteError

    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    for target in (blocker / "x.json", tmp_path / "nodir" / "x.json", tmp_path):
        with pytest.raises(UserError) as generic:
            write_bytes(target, b"{}")
        with pytest.raises(PlanWriteError) as plan:
            plans.save(round_robin(2), target)
        assert str(generic.value) == str(plan.value)
        assert str(plan.value).startswith(f"cannot write {target}: ")
        assert isinstance(generic.value, OSError) and isinstance(plan.value, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]
