# fedlm: `make run` installs what is missing and runs the default simulation;
# `make test` installs what is missing and runs the test suite.
PYTHON ?= python3
STAMP := .make/installed
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: install run test

# torch first, pinned: the CPU build. An unpinned torch pulls GBs of CUDA.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m pip install --quiet "torch==2.13.0"
	$(PYTHON) -m pip install --quiet -e ".[test]"
	@# Debian's Chromium drives the dashboard's browser test (no `playwright install`).
	@command -v chromium >/dev/null || $(SUDO) apt-get install -y -q chromium \
		|| { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }
	@mkdir -p .make && touch $(STAMP)

install: $(STAMP)

run: install
	$(PYTHON) -m fedlm run

test: install
	$(PYTHON) -m pytest -q --durations=10
