#!/usr/bin/env bash
# make gpu-wheels: the pure-Python packages queryrl imports that a lent GPU machine's Python lacks, as wheels
# for Python 3.12 in .whl/ (ignored by git; carried to the machine for make gpu-check). Run where PyPI answers.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
rm -rf .whl && mkdir -p .whl
# omegaconf's parser runtime has no wheel on PyPI (sdist only, pure Python): built here
"$PY" -m pip wheel -q --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
# gpu-check's trl_step: TRL at pyproject.toml's bench-extra pin, and of its and datasets' requirements
# (Requires-Dist) those the machine's image lacks: datasets, dill, multiprocess (accelerate, pandas, pyarrow,
# xxhash, fsspec, aiohttp, httpx, huggingface-hub, psutil and jinja2 are in it). datasets 5 wants
# huggingface-hub >= 1.31 (the image has 1.33) and pyarrow >= 24 for its parquet reader, which trl_step does not
# use (its prompts are built in memory); dill and multiprocess within datasets' pins.
TRL=$(grep -o '"trl==[^"]*"' pyproject.toml | tr -d '"')
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none \
    --platform any -d .whl "omegaconf==2.3.0" "tenacity>=8.2" "$TRL" "datasets>=4.7,<6" "dill>=0.3.0,<0.4.2" \
    "multiprocess<0.70.20"
ls -l .whl
du -sh .whl
