#!/usr/bin/env bash
# Evaluate saved lever models on every held-out row of a bench split (the levers in experiments/logs/real_model.md use
# the first 64): the bench's baselines, the warm-up and each NAME=MODEL given, each GRPO model paired with
# the warm-up, the reference and concat_last3.
#
#   experiments/eval_all_rows.sh BENCH_WORK OUT NAME=MODEL [NAME=MODEL ...]
#
# BENCH_WORK: the --work folder of a bench run (its data/test.parquet and warmup/); OUT: a new folder.
# SPLIT (environment): the split to evaluate, test (default) or val (to choose a checkpoint on: pick_on_val.py);
# ROWS: its first N rows (default 0: all); WARMUP=0 leaves the warm-up model out.
# DTYPE (environment): the eval's compute dtype, float32 (default, as the levers were measured) or bfloat16 (as the
# bench chooses where the CPU has it: compare like with like).
set -euo pipefail
work=$(realpath "$1"); out=$(realpath -m "$2"); shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
kb="${KDCONV_DIR:-$here/../shared/data/kdconv/travel}/kb_travel.json"
split=${SPLIT:-test}; rows=${ROWS:-0}
[ -f "$work/data/$split.parquet" ] || { echo "$work/data/$split.parquet: not a bench run"; exit 2; }
[ -e "$out" ] && { echo "$out exists; give a new folder"; exit 2; }
mkdir -p "$out"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
systems="raw_turn,concat_last3,reference"
compare=""
[ "${WARMUP:-1}" = 0 ] || systems="$systems,warmup=$work/warmup"
for pair in "$@"; do
  name=${pair%%=*}
  systems="$systems,$pair"
  [ "${WARMUP:-1}" = 0 ] || compare="$compare,$name:warmup"
  compare="$compare,$name:reference,$name:concat_last3"
done
"$here/.venv/bin/queryrl" eval --config "$here/configs/query_rewrite_kdconv.yaml" --data "$work/data/$split.parquet" \
  --corpus "kdconv:$kb" --max-new-tokens 48 --dtype "${DTYPE:-float32}" --batch-size 8 --max-samples "$rows" --systems "$systems" \
  --compare "${compare#,}" --out "$out/eval.json" > "$out/eval.log" 2>&1
echo "wrote $out/eval.json"
