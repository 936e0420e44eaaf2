#!/usr/bin/env bash
# The GPU check: one command, under 8 minutes on one H200, everything under $OUT.
#   scripts/gpu_check.sh [--dry-run] [--wheels DIR]      (OUT default runs/gpu_check)
# 1. installs the CUDA stack into .venv (torch 2.13.0 CUDA build, fbgemm-gpu 1.8.0, from the wheels
#    in DIR with no index, else from pip's index); 2. writes 1-rank plans: tiny fused, multihot-26
#    fused and fused_uvm_caching at two cache load factors; 3. profiles each on CUDA; 4. analyzes
#    each and writes $OUT/gpu_check.json and gpu_check.txt (sparselift/gpu_check.py): the fitted
#    lookup coefficients and the UVM miss cost beside the h100x8/h200x8 presets'.
# --dry-run (CPU): checks the wheels and prints what would be installed (installs nothing), writes
# the same CUDA plans, then profiles and analyzes tiny and a small multihot-26 on CPU with fused
# kernels (UVM caching needs CUDA: its comparison runs on the fused profile as a stand-in).
# Every step has a time budget (GPU_CHECK_LIMIT_S, default 470 s, caps them all); a failed step is
# one line on stderr, the report covers what finished, and the exit status is then non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
WHEELS=""
usage="usage: scripts/gpu_check.sh [--dry-run] [--wheels DIR]"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --wheels) [ $# -ge 2 ] || { echo "gpu_check: --wheels needs a directory" >&2; exit 2; }
      WHEELS=$2; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 ($usage)" >&2; exit 2 ;;
  esac
  shift
done

OUT=${OUT:-runs/gpu_check}
LIMIT_S=${GPU_CHECK_LIMIT_S:-470}
TORCH=torch==2.13.0
FBGEMM=fbgemm-gpu==1.8.0
MH26_ROWS=${GPU_CHECK_MAX_ROWS:-1000000}
LOAD_FACTORS="0.1 0.5"
TORCH_WHL=""
FBGEMM_WHL=""
START=$SECONDS
FAILED=0
PY=.venv/bin/python
SL=.venv/bin/sparselift

die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }  # die MESSAGE [STATUS]
note() { echo "[$((SECONDS - START))s] $*"; }

export OUT PY SL TORCH FBGEMM MH26_ROWS LOAD_FACTORS WHEELS TORCH_WHL FBGEMM_WHL
mkdir -p "$OUT/logs" "$OUT/plans" "$OUT/prof" 2>/dev/null || die "cannot create $OUT" 2

# step NAME BUDGET_S CMD…: run CMD (output in $OUT/logs/NAME.log) within its budget and what is
# left of the total; a failure is one line on stderr and marks the check failed.
step() {
  local name=$1 budget=$2 left rc
  shift 2
  left=$((LIMIT_S - (SECONDS - START)))
  if [ "$left" -lt 15 ]; then
    echo "gpu_check: no time left for step $name (${LIMIT_S}s limit)" >&2
    FAILED=1
    return 124
  fi
  [ "$budget" -le "$left" ] || budget=$left
  note "$name (budget ${budget}s)"
  # bash -c: CMD may be one of the exported functions below
  timeout --kill-after=10 "$budget" bash -c '"$@"' "$name" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "gpu_check: step $name ran past its ${budget}s budget (log: $OUT/logs/$name.log)" >&2
  elif [ $rc -ne 0 ]; then
    echo "gpu_check: step $name failed (exit $rc): $(grep -v '^\s*$' "$OUT/logs/$name.log" \
      | tail -n 1) (log: $OUT/logs/$name.log)" >&2
  else
    note "$name done"
  fi
  [ $rc -eq 0 ] || FAILED=1
  return $rc
}

# --- 1. the CUDA stack -------------------------------------------------------------------------
wheel_files() {  # the CUDA torch and fbgemm-gpu wheels in $WHEELS, or a one-line failure
  local t f
  t=$(find "$WHEELS" -maxdepth 1 -name 'torch-2.13.0*.whl' ! -name '*+cpu*' | sort | head -n 1)
  f=$(find "$WHEELS" -maxdepth 1 -name 'fbgemm_gpu-1.8.0-*.whl' | sort | head -n 1)
  [ -n "$t" ] || die "no CUDA torch 2.13.0 wheel (torch-2.13.0*.whl, not +cpu) in $WHEELS"
  [ -n "$f" ] || die "no fbgemm-gpu 1.8.0 wheel (fbgemm_gpu-1.8.0-*.whl) in $WHEELS"
  echo "$t $f"
}

if [ -n "$WHEELS" ]; then
  [ -d "$WHEELS" ] || die "--wheels $WHEELS is not a directory" 2
  read -r TORCH_WHL FBGEMM_WHL <<<"$(wheel_files)" || exit 1
  [ -n "${FBGEMM_WHL:-}" ] || exit 1
  note "wheels: $TORCH_WHL $FBGEMM_WHL"
fi
sed 's/^fbgemm-gpu-cpu==/fbgemm-gpu==/' requirements.txt >"$OUT/requirements-gpu.txt"
if [ "$DRY" = 1 ]; then
  [ -x "$PY" ] || die "no .venv: run scripts/setup.sh first" 2
  src=${WHEELS:-"pip's index"}
  note "dry run: would install $TORCH $FBGEMM (CUDA builds, --force-reinstall --no-deps) from" \
    "$src, then $OUT/requirements-gpu.txt, torchrec==1.8.0 --no-deps and this package"
  DEV=cpu
else
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU' \
    || die "no GPU: nvidia-smi lists none (scripts/gpu_check.sh --dry-run checks on CPU)"
  [ -x "$PY" ] || python3 -m venv .venv || die "cannot create .venv"
  install_stack() {
    local pip=("$PY" -m pip install --disable-pip-version-check -q) cuda=("$TORCH" "$FBGEMM")
    if [ -n "$WHEELS" ]; then
      pip+=(--no-index --find-links "$WHEELS")
      cuda=("$TORCH_WHL" "$FBGEMM_WHL")
    fi
    # the CUDA builds replace the CPU ones (same versions, so only forced); skipped when there
    if "$PY" -m pip show -q fbgemm-gpu-cpu >/dev/null 2>&1 || ! "$PY" -c 'import torch, sys
sys.exit(not (torch.version.cuda and torch.__version__.startswith("2.13.0")))' 2>/dev/null; then
      "$PY" -m pip uninstall -y -q fbgemm-gpu-cpu >/dev/null 2>&1 || true
      "${pip[@]}" --force-reinstall --no-deps "${cuda[@]}" || return 1
    fi
    "${pip[@]}" -r "$OUT/requirements-gpu.txt" "${cuda[@]}" \
      && "${pip[@]}" --no-deps torchrec==1.8.0 \
      && "${pip[@]}" --no-deps --no-build-isolation -e . \
      && "$PY" -c 'import torch, fbgemm_gpu
assert torch.version.cuda, f"torch {torch.__version__} is not a CUDA build"
assert torch.cuda.is_available(), "torch sees no GPU"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  }
  export -f install_stack
  step install 240 install_stack || exit 1  # its one line is printed
  note "$(tail -n 1 "$OUT/logs/install.log")"
  DEV=cuda
fi

# --- 2. plans (1 rank) -------------------------------------------------------------------------
# The CUDA plans are written in both modes (a dry run checks that they pass the plan checks);
# on CPU the profiled plans are the fused ones for device cpu.
plans() {
  local dev=$1 dir=$OUT/plans/$1 lf
  mkdir -p "$dir"
  "$SL" plan round-robin --workload tiny --world-size 1 --device "$dev" \
    --out "$dir/tiny_fused.json" \
    && "$SL" plan round-robin --workload multihot-26 --world-size 1 --device "$dev" \
      --max-rows "$MH26_ROWS" --out "$dir/mh26_fused.json" || return 1
  [ "$dev" = cuda ] || return 0
  for lf in $LOAD_FACTORS; do
    "$PY" -m sparselift.gpu_check plan "$dir/mh26_fused.json" "$dir/mh26_uvm_$lf.json" \
      --kernel fused_uvm_caching --lf "$lf" || return 1
  done
}
export -f plans
step plans 90 plans cuda || exit 1
if [ "$DRY" = 1 ]; then
  MH26_ROWS=${GPU_CHECK_MAX_ROWS:-5000}
  step plans_cpu 60 plans cpu || exit 1
  # tiny steps, small batches: every step runs, on 2 shared cores
  PROF=(--warmup 2 --steps 6 --after 3 --steady-steps 3)
  MH26=(--batch-size 64)
  RUNS=(mh26_fused tiny_fused)
else
  PROF=(--warmup 3 --steps 6 --after 5 --steady-steps 5)
  MH26=()
  RUNS=(mh26_fused)  # the UVM comparison first: tiny is only a sanity check
  for lf in $LOAD_FACTORS; do RUNS+=("mh26_uvm_$lf"); done
  RUNS+=(tiny_fused)
fi

# --- 3. profiles, 4. analysis ------------------------------------------------------------------
DONE=()
for run in "${RUNS[@]}"; do
  case $run in
    tiny_*) w=(--workload tiny) ;;
    *) w=(--workload multihot-26 --max-rows "$MH26_ROWS" "${MH26[@]}") ;;
  esac
  prof=$OUT/prof/$run
  step "profile_$run" 120 "$SL" profile "${w[@]}" --nproc 1 --device "$DEV" \
    --plan "$OUT/plans/$DEV/$run.json" "${PROF[@]}" --out "$prof" --force || continue
  step "analyze_$run" 60 "$SL" analyze "$prof" || continue
  DONE+=("$run")
done

# --- the report --------------------------------------------------------------------------------
has() { local x; for x in "${DONE[@]}"; do [ "$x" = "$1" ] && return 0; done; return 1; }
args=()
for run in "${DONE[@]}"; do
  case $run in
    mh26_uvm_*)
      has mh26_fused && args+=(--run "$run=$OUT/prof/$run,kernel=fused_uvm_caching,lf=${run#mh26_uvm_},baseline=mh26_fused") ;;
    *) args+=(--run "$run=$OUT/prof/$run") ;;
  esac
done
if [ "$DRY" = 1 ] && has mh26_fused; then  # the UVM arithmetic on a stand-in: the fused profile
  for lf in $LOAD_FACTORS; do
    args+=(--run "mh26_uvm_$lf=$OUT/prof/mh26_fused,kernel=fused_uvm_caching,lf=$lf,baseline=mh26_fused,stand_in=1")
  done
fi
[ ${#args[@]} -gt 0 ] || die "no run finished: nothing to report (logs in $OUT/logs)"
if step report 60 "$PY" -m sparselift.gpu_check report --out "$OUT" "${args[@]}"; then
  cat "$OUT/gpu_check.txt"
fi
note "total $((SECONDS - START))s (limit ${LIMIT_S}s); results in $OUT"
[ "$FAILED" = 0 ] || die "some steps failed (above); $OUT has what finished"
exit 0
