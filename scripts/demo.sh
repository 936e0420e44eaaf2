#!/usr/bin/env bash
# The README's demo: real sharded TorchRec training of `tiny` on 2 CPU ranks (gloo).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${DEMO_OUT:-runs/demo}
mkdir -p "$out"
.venv/bin/sparselift train --workload tiny --nproc 2 --steps 30 --json "$out/train.json"
echo "demo: result in $out/train.json"
