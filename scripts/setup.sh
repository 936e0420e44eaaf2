#!/usr/bin/env bash
# One command that makes a working SparseLift checkout: .venv with the pinned stack + the package.
# GPU hosts: SPARSELIFT_GPU=1 scripts/setup.sh swaps fbgemm-gpu-cpu for fbgemm-gpu of the same version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check -q)
if [ "${SPARSELIFT_GPU:-0}" = 1 ]; then
  sed 's/^fbgemm-gpu-cpu==/fbgemm-gpu==/' requirements.txt > .venv/requirements.txt
else
  cp requirements.txt .venv/requirements.txt
fi
"${pip[@]}" -r .venv/requirements.txt -r requirements-dev.txt
"${pip[@]}" --no-deps torchrec==1.8.0
"${pip[@]}" --no-deps --no-build-isolation -e .
# The HTML report's browser test drives Debian's chromium (headless); install it where we can.
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null \
      || echo "sparselift: could not install chromium; the HTML report test needs it" >&2
  else
    echo "sparselift: install Debian's chromium for the HTML report test (apt-get install chromium)" >&2
  fi
fi
touch .venv/.installed
echo "sparselift: .venv ready ($(.venv/bin/python -c 'import torch, torchrec, fbgemm_gpu; print("torch", torch.__version__, "torchrec", torchrec.__version__)'))"
