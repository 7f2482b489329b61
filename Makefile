# Two entry points on a fresh machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Optional extras installed for the demo and the tests (CI installs them all,
# so no env test is skipped there).
EXTRAS ?= pettingzoo,sisl,butterfly,openspiel,lbf,rware,magent2,ray,train,track,dev
# A CPU build of PyTorch installs in seconds where this wheel is on hand; a
# plain `pip install torch` would fetch a multi-GB CUDA build.
TORCH_CPU ?= 2.13.0
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: run play test lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "torch==$(TORCH_CPU)" \
		|| echo "torch $(TORCH_CPU) is not available here: the torch extra comes from the index"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(STAMP)

# The main job: train MAPPO on MPE simple_spread (natively batched, 64 envs; its time on
# 2 cores: benchmarks/README.md), then draw its learning curve with the random and scripted
# baselines, score it next to them and record a GIF of the trained agents.
RUN_DIR ?= runs/make-run-mappo-simple_spread
RUN_STEPS ?= 800000
run: install
	rm -rf $(RUN_DIR)
	$(BIN)/corral train mappo --env mpe2/simple_spread_v3 --total-steps $(RUN_STEPS) \
		--run-dir $(RUN_DIR) --set eval_every=50000 eval_episodes=32
	$(BIN)/corral plot $(RUN_DIR) --baselines -o $(RUN_DIR)/curve.png
	$(BIN)/corral eval $(RUN_DIR) --episodes 100 --baselines --gif $(RUN_DIR)/episode.gif
	@echo "run directory: $(RUN_DIR) (curve.png, episode.gif, metrics.csv, best.pt)"

# Random policies through the env layer, and the conformance checker.
play: install
	$(BIN)/corral play mpe2/simple_spread_v3 --episodes 3 --seed 0 --set N=3 --set max_cycles=25
	$(BIN)/corral play pettingzoo/classic/connect_four_v3 --episodes 3 --seed 0
	$(BIN)/corral play openspiel/kuhn_poker --episodes 3 --seed 0
	$(BIN)/corral play corral/tag --episodes 2 --seed 0
	$(BIN)/corral check mpe2/simple_spread_v3

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy

# The suite in TEST_WORKERS processes (pytest-xdist); the tests that start Ray run one after
# another in one of them (conftest.py groups them), as two Rays on 2 cores would starve.
TEST_WORKERS ?= 2
test: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
