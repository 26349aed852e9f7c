#!/usr/bin/env bash
# Continue a finished GRPO run of benchmarks/real_model.py to more steps, then evaluate every saved step
# on the same held-out rows as the bench (one lever: "more GRPO steps", without paying the first steps again).
#
#   experiments/continue_grpo.sh BENCH_WORK OUT STEPS [EVERY] [EVAL_ROWS]
#
# BENCH_WORK: the --work folder of a finished bench run (its data/, warmup/, grpo_run/ and grpo/);
# OUT: a new folder (grpo_run/ is copied there and resumed, so BENCH_WORK is left as it was);
# STEPS: the new trainer.total_steps; EVERY: save (and evaluate) every EVERY steps (default 20);
# EVAL_ROWS: the first N held-out rows (default 64, as the levers in experiments/logs/real_model.md); 0: export the
# saved steps but evaluate nothing (then experiments/eval_all_rows.sh evaluates the ones wanted).
# BASE_WORK (environment): where data/ and warmup/ are, when BENCH_WORK is itself a continuation (default BENCH_WORK).
# DTYPE (environment): the eval's compute dtype, float32 (default, as the levers were measured) or bfloat16 (as the
# bench chooses where the CPU has it: compare like with like).
# The continuation uses the saved run's config (trainer.resume=auto refuses any change that alters a step);
# the systems evaluated are the bench's baselines, the warm-up model and grpo_<step> for each saved step.
set -euo pipefail
work=$(realpath "$1"); out=$(realpath -m "$2"); steps=$3; every=${4:-20}; rows=${5:-64}
base=$(realpath "${BASE_WORK:-$1}")
here=$(cd "$(dirname "$0")/.." && pwd)
queryrl="$here/.venv/bin/queryrl"
config="$here/configs/query_rewrite_kdconv.yaml"
kb="${KDCONV_DIR:-$here/../shared/data/kdconv/travel}/kb_travel.json"
[ -d "$work/grpo_run/checkpoints" ] || { echo "$work/grpo_run/checkpoints: not a finished bench run"; exit 2; }
[ -e "$out" ] && { echo "$out exists; give a new folder"; exit 2; }
mkdir -p "$out/logs"
cp -r "$work/grpo_run" "$out/grpo_run"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# the saved config, with only what may differ on a resume changed
"$queryrl" train --config "$out/grpo_run/config.yaml" "trainer.output_dir=$out" trainer.experiment_name=grpo_run \
  trainer.resume=auto "trainer.total_steps=$steps" "trainer.save_every=$every" trainer.keep_last=100 \
  > "$out/logs/grpo.log" 2>&1
systems="raw_turn,concat_last3,reference,warmup=$base/warmup"
compare=""
for ckpt in "$out"/grpo_run/checkpoints/step_*; do
  s=${ckpt##*_}
  "$queryrl" export "$ckpt" "$out/grpo_$s" > "$out/logs/export_$s.log" 2>&1
  systems="$systems,grpo_$s=$out/grpo_$s"
  compare="$compare,grpo_$s:warmup,grpo_$s:reference,grpo_$s:concat_last3"
done
[ "$rows" = 0 ] && { echo "exported the saved steps to $out/grpo_<step>; evaluated nothing (EVAL_ROWS=0)"; exit 0; }
"$queryrl" eval --config "$config" --data "$base/data/test.parquet" --corpus "kdconv:$kb" --max-new-tokens 48 \
  --dtype "${DTYPE:-float32}" --batch-size 8 --max-samples "$rows" --systems "$systems" --compare "${compare#,}" \
  --out "$out/eval/eval.json" > "$out/logs/eval.log" 2>&1
echo "wrote $out/eval/eval.json"
