# Two entry points on a fresh machine: `make run` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Optional extras installed for the demo and the tests (CI installs them all,
# so no env test is skipped there).
EXTRAS ?= pettingzoo,sisl,butterfly,openspiel,ray,torch,dev
# A CPU build of PyTorch installs in seconds where this wheel is on hand; a
# plain `pip install torch` would fetch a multi-GB CUDA build.
TORCH_CPU ?= 2.13.0
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: run test lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "torch==$(TORCH_CPU)" \
		|| echo "torch $(TORCH_CPU) is not available here: the torch extra comes from the index"
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(STAMP)

run: install
	$(BIN)/corral play mpe2/simple_spread_v3 --episodes 3 --seed 0 --set N=3 --set max_cycles=25
	$(BIN)/corral play pettingzoo/classic/connect_four_v3 --episodes 3 --seed 0
	$(BIN)/corral play openspiel/kuhn_poker --episodes 3 --seed 0
	$(BIN)/corral play corral/tag --episodes 2 --seed 0
	$(BIN)/corral check mpe2/simple_spread_v3

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

test: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
