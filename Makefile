# Two entry points (README): `make demo` runs the main job on the simulated cluster, `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: venv demo test clean

$(BIN)/tracebench: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

venv: $(BIN)/tracebench

# generate a Poisson trace -> replay it on a simulated 2-GPU cluster under two policies -> compare them.
demo: venv
	$(BIN)/tracebench generate --rate 16 --num-requests 400 --seed 0 -o traces/demo.jsonl
	$(BIN)/tracebench inspect traces/demo.jsonl
	$(BIN)/tracebench replay traces/demo.jsonl --backend sim --gpus 2 --speed 4 --max-running-requests 16 \
		--policy round_robin --run-name demo-round_robin --quiet
	$(BIN)/tracebench replay traces/demo.jsonl --backend sim --gpus 2 --speed 4 --max-running-requests 16 \
		--policy sjf --run-name demo-sjf --quiet
	$(BIN)/tracebench report demo-round_robin demo-sjf -o reports/demo-report.html --format html
	$(BIN)/tracebench report demo-round_robin demo-sjf

test: venv
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) build *.egg-info
