# fedlm: `make run` installs what is missing and runs the default simulation;
# `make test` installs what is missing and runs the test suite.
PYTHON ?= python3
RUN_STAMP := .make/installed-run
TEST_STAMP := .make/installed-test
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: install install-test run test

# torch first, pinned: the CPU build. An unpinned torch pulls GBs of CUDA.
# Running needs only the package; the tests add their extras, the experiment trackers
# (whose files they read back) and a browser.
$(RUN_STAMP): pyproject.toml Makefile
	$(PYTHON) -m pip install --quiet "torch==2.13.0"
	$(PYTHON) -m pip install --quiet -e .
	@mkdir -p .make && touch $@

$(TEST_STAMP): $(RUN_STAMP)
	$(PYTHON) -m pip install --quiet -e ".[test,track]"
	@# Debian's Chromium drives the dashboard's browser test (no `playwright install`).
	@command -v chromium >/dev/null || $(SUDO) apt-get install -y -q chromium \
		|| { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q chromium; }
	@mkdir -p .make && touch $@

install: $(RUN_STAMP)

install-test: $(TEST_STAMP)

run: install
	$(PYTHON) -m fedlm run

test: install-test
	$(PYTHON) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15
