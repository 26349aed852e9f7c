#!/usr/bin/env bash
# make gpu-check: benchmarks/gpu_check.py with the python that holds the GPU's torch (PYTHON, default python3).
#
# A lent GPU machine has torch, transformers and peft but reaches no package registry, so nothing is
# installed into it: queryrl runs from this checkout (PYTHONPATH), and the few pure-Python packages it
# needs that such a machine lacks come as wheels in .whl/, made beforehand on a machine with PyPI by
# `make gpu-wheels` and carried along. They are unpacked into a folder of their own, never over torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SITE="${TMPDIR:-/tmp}/queryrl-gpu-site"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = ["torch", "transformers", "peft", "safetensors", "tokenizers", "omegaconf", "yaml", "tenacity", "pandas", "numpy"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PYEOF
)
if [ -n "$missing" ]; then
    echo "gpu-check: $PY lacks: $missing. On a machine with PyPI run 'make gpu-wheels' and bring .whl/ along." >&2
    exit 2
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}" TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# 8 minutes at most on one H100 (the issue's budget); the JSON is written after each check, and the comparison with
# TRL (the last) runs fewer steps when the limit is near
LIMIT="${GPU_CHECK_TIMEOUT:-480}"
exec timeout "$LIMIT" "$PY" benchmarks/gpu_check.py --budget-s "$((LIMIT - 30))" "$@"
