# Two commands set up and run everything: `make demo` and `make test`.
# Both create .venv when it is missing and install the package into it; installing again is
# skipped until pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# tiny models run best on one thread
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1

.PHONY: demo demo-toy test lint format pytest install clean bench-step bench-kdconv

# The main job: the query-rewrite demo (configs/query_rewrite_demo.yaml). The tiny model and its
# tokenizer are built once into the cache; SFT warm start on the reference rewriter's answers, GRPO
# against the embedded RAG service and the offline judge, then evaluation on the test split against
# the baselines: runs/demo/eval.json, runs/demo/eval.png and the training curves in runs/demo/plots/.
DEMO_CFG := configs/query_rewrite_demo.yaml
DEMO_DIR := runs/demo

demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(BIN)/queryrl sft --config $(DEMO_CFG)
	$(BIN)/queryrl train --config $(DEMO_CFG) model.path=$(DEMO_DIR)/sft trainer.resume=disable
	$(BIN)/queryrl export $$(ls -d $(DEMO_DIR)/checkpoints/step_* | sort -t_ -k2 -n | tail -1) $(DEMO_DIR)/grpo
	$(BIN)/queryrl eval --config $(DEMO_CFG) --data builtin://sales_demo/test \
		--systems raw_turn,concat_last3,reference,sft=$(DEMO_DIR)/sft,grpo=$(DEMO_DIR)/grpo --out $(DEMO_DIR)/eval.json

# The toy GRPO preset: a tiny model learns to say "hello" from reward alone (about a minute).
demo-toy: $(STAMP)
	$(BIN)/queryrl train --config configs/toy_grpo.yaml

bench-step: $(STAMP)
	$(BIN)/python benchmarks/step_phases.py

# KdConv travel (../shared/data/kdconv/travel; KDCONV_DIR to change): SFT + GRPO on dev.json's training
# conversations, evaluation on the held-out ones (or on the KdConv file $KDCONV_TEST) against the
# baselines -> benchmarks/results/kdconv.json. Skips with a message when the KdConv folder is absent.
bench-kdconv: $(STAMP)
	$(BIN)/python benchmarks/kdconv.py

test: lint pytest

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check queryrl tests tools benchmarks
	$(BIN)/ruff format --check queryrl tests tools benchmarks
	$(BIN)/mypy --strict queryrl/algos
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format queryrl tests tools benchmarks
	$(BIN)/ruff check --fix queryrl tests tools benchmarks

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
