#!/usr/bin/env bash
# make gpu-wheels: the pure-Python packages queryrl imports that a lent GPU machine's Python lacks, as wheels
# for Python 3.12 in .whl/ (ignored by git; carried to the machine for make gpu-check). Run where PyPI answers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
rm -rf .whl && mkdir -p .whl
# omegaconf's parser runtime has no wheel on PyPI (sdist only, pure Python): built here
"$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none \
    --platform any -d .whl "omegaconf==2.3.0" "tenacity>=8.2"
ls -l .whl
