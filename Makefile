# Two commands: `make demo` (install + run the main job) and `make test`.
# Installs into .venv with the CPU torch pin, so nothing downloads a CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: install demo test bench bench-quick clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml client/pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e ./client -e '.[test]'
	touch $@

demo: install
	$(PY) scripts/demo.py

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[bench]'
	$(PY) benchmarks/bench.py

bench-quick: install
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[bench]'
	$(PY) benchmarks/bench.py --quick

clean:
	rm -rf $(VENV) .pytest_cache
