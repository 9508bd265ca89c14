# Two commands: `make demo` (install + run the main job) and `make test`.
# Installs into .venv with the CPU torch pin, so nothing downloads a CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python

.PHONY: install demo test test-engines image image-check mutate mutmut bench bench-quick clean node-example wheelhouse

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml client/pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e './client[plot]' -e '.[test,multimodal]'
	touch $@

# The demo serves the starter model, trained on the spot the first time (about a minute).
STARTER := runs/starter

demo: install $(STARTER)/head.pt
	$(PY) scripts/demo.py --model $(STARTER)

$(STARTER)/head.pt: | install
	$(VENV)/bin/jevany-daemon tiny-model --trained $(STARTER)

# Two pytest-xdist workers: most of the suite waits on daemons it started, so two at once
# keep both cores busy. Tests share nothing on disk or on sockets (each has its own tmp dir);
# loadfile keeps each file on one worker, in order, with its module-scoped daemon; files are handed
# out in the order collected, longest first (tests/conftest.py, SLOW_FIRST), not by test count.
test: install node-example test-engines
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The real engines tests/deploy drives (a one-host Slurm, HAProxy), from the distribution's packages
# where this runs as root with apt-get; elsewhere one line says so and those tests skip with the reason.
# JEVANY_TEST_ENGINES=skip leaves the machine's packages alone.
test-engines:
	@scripts/test-engines

# The container image the Kubernetes recipes run (deploy/image/build.sh; docs/ACROSS-HOSTS.md, "The image"):
# a Debian root filesystem from the distribution's packages, the project from wheels with the CPU torch
# pin, written as an OCI layout in dist/image. As root (installs mmdebstrap and umoci where missing).
# IMAGE_ARGS passes options on: make image IMAGE_ARGS="--out /srv/image".
image: install
	deploy/image/build.sh $(IMAGE_ARGS)

# Builds the image and runs it under runc: a decision answered inside it, a drain on SIGTERM (minutes:
# outside make test's budget; tests/deploy/test_image.py).
image-check: install
	@command -v runc >/dev/null 2>&1 || [ "$$(id -u)" -ne 0 ] || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends runc >/dev/null 2>&1 || true
	JEVANY_TEST_IMAGE=1 $(PY) -m pytest -q -rs tests/deploy/test_image.py

# The mutation check (scripts/mutate.py): plausible one-line bugs planted one at a time, each run
# against the tests that cover its module; prints the score and the survivors, exit 1 below 95%.
# Not part of `make test`: one child pytest per mutation (its docstring says how long a run takes).
# MUTATE_ARGS passes options on: make mutate MUTATE_ARGS="--only gather tenants".
mutate: install
	$(PY) scripts/mutate.py $(MUTATE_ARGS)

# mutmut's own operators over pure-Python client modules tested in process (scripts/mutmut_client.py
# says where it fits and why the daemon's modules stay with mutate). Installs mutmut into the venv.
mutmut: install
	$(PY) -m pip install --quiet --disable-pip-version-check mutmut==3.8.1
	$(PY) scripts/mutmut_client.py $(MUTMUT_ARGS)

# The Node.js client example's packages (zeromq ships prebuilt binaries; nothing is compiled).
# Without npm, or if the registry is unreachable, its test is skipped rather than failing the run.
NODE_EXAMPLE := examples/node
node-example: $(NODE_EXAMPLE)/node_modules/.installed

$(NODE_EXAMPLE)/node_modules/.installed: $(NODE_EXAMPLE)/package.json $(NODE_EXAMPLE)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		(cd $(NODE_EXAMPLE) && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed) \
		|| echo "npm ci failed in $(NODE_EXAMPLE): its test will be skipped"; \
	else echo "npm not found: the Node.js client test will be skipped"; fi

bench: install
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[bench]'
	$(PY) benchmarks/bench.py

bench-quick: install
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-cpu.txt -e '.[bench]'
	$(PY) benchmarks/bench.py --quick

# An offline GPU host's packages (docs/GPUS.md, "Serving a real checkpoint on a GPU"): every pin of
# constraints-gpu.txt and our two packages as wheels for the host's Python and platform, never
# torch (the host has its CUDA build), then a check that the folder meets every requirement.
# Downloads: run it on a connected machine. (Not PY=: PY is the venv's interpreter here.)
PYTHON_VERSION ?= 3.12
PLATFORM       ?= manylinux_2_28_x86_64
HOST_TORCH     ?= 2.11.0
WHEELHOUSE     ?= wheelhouse

wheelhouse:
	$(PYTHON) scripts/wheelhouse.py --out $(WHEELHOUSE) --python-version $(PYTHON_VERSION) \
		--platform $(PLATFORM) --provided torch==$(HOST_TORCH)

clean:
	rm -rf $(VENV) .pytest_cache $(NODE_EXAMPLE)/node_modules
