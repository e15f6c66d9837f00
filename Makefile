PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the exact versions the suite runs with (the CPU build of torch among them); users get the ranges
# of pyproject.toml
CONSTRAINTS := constraints.txt
# qwen-vl-utils (the reference tests/test_qwen_plan.py checks shmloader.qwen against) imports torchvision,
# which PyPI builds for CUDA torch only: beside the CPU build its C++ ops cannot load, and installed in the
# venv it would break `import lightning` (torchmetrics imports it when present). Its Python code goes to a
# folder of its own, .venv/reference, that only those tests put on sys.path. The one torch 2.13 pairs with.
TORCHVISION := 0.28.0
PYTEST_ARGS ?=

.PHONY: demo test check test-newest test-oldest test-lerobot typecheck docs dist test-other-cpu bench bench-peers peers bench-scale bench-recipes notebooks clean

# uv installs the venv: ~30 s where pip's resolver took ~2 min on 2 cores. Unlike pip it leaves
# the bytecode to the first import, which writes none where PYTHONDONTWRITEBYTECODE is set (as in
# many containers): every process of the suite then compiled what it imported (TensorFlow's import
# 12 s instead of 4.5), hence --compile-bytecode, and the package's own compiled before each run
# (workers import it; an editable install is compiled by neither). It reads pip's
# variables for where torch's CPU build lies (PIP_FIND_LINKS, PIP_EXTRA_INDEX_URL, PIP_INDEX_URL),
# and takes the best version among all indexes as pip does (not the first index's).
UV := $(VENV)/bin/uv
comma := ,
space := $(subst ,, )
ifdef PIP_FIND_LINKS
export UV_FIND_LINKS ?= $(subst $(space),$(comma),$(strip $(PIP_FIND_LINKS)))
endif
ifdef PIP_EXTRA_INDEX_URL
export UV_EXTRA_INDEX_URL ?= $(PIP_EXTRA_INDEX_URL)
endif
ifdef PIP_INDEX_URL
export UV_DEFAULT_INDEX ?= $(PIP_INDEX_URL)
endif
export UV_INDEX_STRATEGY ?= unsafe-best-match

# shmloader is installed editable as a path in a .pth file (setuptools' editable_mode=compat), not by
# setuptools' default import finder: that finder comes after every folder of sys.path, so Python run
# from the folder that holds the clone (itself named shmloader, without an __init__.py) took the clone
# for a namespace package (no Loader). A regular package found on any path wins over such a folder
# (tests/test_install.py).
EDITABLE := --config-settings-package shmloader:editable_mode=compat
$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) uv
	$(UV) pip install --quiet --compile-bytecode --python $(PY) -c $(CONSTRAINTS) $(EDITABLE) pip -e '.[tf,torch,jax,keras,ray,hdf5,samples,bench,notebooks,docs,test,trainers,omni,lerobot,opensora]'
	$(UV) pip install --quiet --compile-bytecode --python $(PY) --no-deps --target $(VENV)/reference torchvision==$(TORCHVISION)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m shmloader demo

# The suite runs in parallel (pytest-xdist), a test module per process so that its module fixtures
# (a Ray cluster, a server) start once, the longest modules first in tests/conftest.py's order
# (not xdist's, by test count); how many processes: its pytest_xdist_auto_num_workers.
# PARALLEL= runs it in this process alone.
PARALLEL ?= -n auto --dist loadfile --no-loadscope-reorder
# make test PYTEST_ARGS="--random-order"   runs the tests in a random order (pytest-random-order)
test: $(STAMP)
	$(PY) -m compileall -q shmloader tests
	$(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

# The edit-test loop: the layout, the types, the options and the core of each capability (the
# plan, the ring's lease, the reader, frames, the runner, the adapters), in a few minutes.
CHECK_TESTS := tests/test_layout.py tests/test_options.py tests/test_api.py tests/test_plan.py tests/test_lease.py \
	tests/test_reader.py tests/test_frames.py tests/test_runner.py tests/test_sources.py tests/test_tf.py tests/test_torch.py \
	tests/test_forkserver.py
check: $(STAMP)
	$(PY) -m compileall -q shmloader tests
	$(PY) -m pytest $(PARALLEL) -x $(CHECK_TESTS) $(PYTEST_ARGS)

# The version lanes (tests/lanes.py), each in a venv of its own (.venv-<lane>-<python>), the whole suite:
# newest: Python 3.12 and 3.13 from pyenv with the newest versions pip picks (no constraints; torch
# is PyPI's CUDA build, as GPU users have it); oldest: Python 3.10 with every requirement at the
# minimum pyproject.toml declares (constraints-oldest.txt).
# make test-newest LANES="3.12"   runs one Python only
LANES ?= 3.12 3.13
test-newest:
	@for v in $(LANES); do $(PYTHON) tests/lanes.py newest $$v $(PARALLEL) $(PYTEST_ARGS) || exit 1; done

test-oldest:
	$(PYTHON) tests/lanes.py oldest 3.10 $(PARALLEL) $(PYTEST_ARGS)

# lerobot: Python 3.12 with lerobot[dataset] 0.6 and shmloader (every extra) resolved together,
# as a LeRobot user adds shmloader: lerobot's pins win (av 15, numpy < 2.3, torch < 2.12) and the lane
# fails unless `pip check` finds nothing broken. torch is PyPI's CUDA build, as in the newest lane
# (lerobot needs torch; PyPI has no CPU build): with its CUDA 12 libraries and every extra the venv
# is ~11 GB, and its first build took 6 min on a fast link (PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL
# with a CPU wheel of torch < 2.12 for 3.12 avoids the CUDA libraries). Tests of a feature av 15
# lacks skip, naming it.
test-lerobot:
	$(PYTHON) tests/lanes.py lerobot 3.12 $(PARALLEL) $(PYTEST_ARGS)

# mypy as configured in pyproject.toml (strict on the public API); make test runs it too (tests/test_typing.py)
typecheck: $(STAMP)
	$(PY) -m mypy

# the docs site in site/ (mkdocs-material; --strict: a broken link, a missing API reference or any
# other warning fails the build); `.venv/bin/mkdocs serve` shows it while you edit docs/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# the sdist and the wheel in dist/, checked as PyPI would (twine check)
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

# the CPU-dependent width tests on an emulated AVX2-only CPU, where decord copies out widths
# that AVX-512 CPUs refuse (needs qemu-user); see tests/other_cpu.py
test-other-cpu: $(STAMP)
	$(PY) tests/other_cpu.py

bench: $(STAMP)
	$(PY) bench/cpu_vs_workers.py

# The peers of issue #12 (grain, SPDL, torchcodec with CPU torch) in the venv, for `make bench`;
# not needed by `make test`. SPDL also needs FFmpeg 5's shared libraries (Debian's packages below).
SPDL_LIBS := libavcodec59 libavformat59 libavfilter8 libswscale6 libavdevice59
peers: $(STAMP)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) torch 'torchcodec==0.13.*' grain spdl
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q $(SPDL_LIBS) >/dev/null || echo "SPDL: apt-get install $(SPDL_LIBS) failed"; \
	else echo "SPDL needs FFmpeg 5's shared libraries: apt-get install $(SPDL_LIBS)"; fi

# every loader and peer on the frame-code videos (cpu2) and on textured ones (cpu2-textured)
bench-peers: peers
	$(PY) bench/cpu_vs_workers.py
	$(PY) bench/cpu_vs_workers.py --content textured --experiments '' --name cpu2-textured

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
	rm -rf $(VENV) .venv-newest-* .venv-oldest-* .venv-lerobot-* .cache .pytest_cache .mypy_cache shmloader.egg-info build dist site
