PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test bench bench-scale bench-recipes notebooks clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[tf,hdf5,samples,bench,notebooks,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m shmloader demo

# make test PYTEST_ARGS="--random-order"   runs the tests in a random order (pytest-random-order)
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/cpu_vs_workers.py

# main-process CPU per sample, rows vs tf.data, growth with workers, worker memory (issue #11)
bench-scale: $(STAMP)
	$(PY) bench/scale.py

# several clips per decode pass on long-GOP videos (issue #10): bench/results/recipes-cpu2.*
bench-recipes: $(STAMP)
	$(PY) bench/recipes.py

notebooks: $(STAMP)
	$(PY) -m pip install --quiet jupyterlab
	$(VENV)/bin/jupyter lab notebooks/

clean:
	rm -rf $(VENV) .cache .pytest_cache
