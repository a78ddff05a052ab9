# The commands a user runs on a fresh machine. `make test` is what CI runs.
VENV ?= .venv
PY := $(VENV)/bin/python

# Test workers for the tiers after the unit tests: most tests wait on real servers and processes
# rather than compute, so more workers than cores still shortens the run (time `make test` with
# JOBS=4 and JOBS=6 on the machine to choose).
JOBS ?= 6

.PHONY: setup demo test unit lint chroots bench clean

# PostgreSQL server binaries for the test suite: Debian's package when we may install it,
# else the pgserver wheel (bundled binaries) inside the virtual environment.
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	@# --no-compile: byte-code is written as modules are first imported (most never are).
	$(VENV)/bin/pip install -q --no-compile -e '.[agent,collector,grafana,demo,dev]'
	@if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql; \
	  else $(VENV)/bin/pip install -q pgserver; fi; \
	fi
	@# A C compiler builds the fake libnvidia-ml.so.1 the agent tests run on; Slurm and munge
	@# run the two-node cluster tests (slurmdbd on MariaDB: its accounting); headless Chromium opens the HTML report (as root; without
	@# root those tests say why they skip); Debian's prometheus scrapes the agent as dcgm-exporter's users do,
	@# and its victoria-metrics beside it in the benchmark that compares the stores (bench/versus_tsdb.py);
	@# openssl makes the certificate of the agent's HTTPS test.
	@missing=""; command -v gcc >/dev/null || missing="$$missing gcc libc6-dev"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v chromium >/dev/null || missing="$$missing chromium fonts-dejavu-core"; \
	command -v prometheus >/dev/null || missing="$$missing prometheus"; \
	command -v victoria-metrics >/dev/null || missing="$$missing victoria-metrics"; \
	for t in slurmctld slurmd sbatch munged; do command -v $$t >/dev/null || [ -x /usr/sbin/$$t ] || missing="$$missing slurmctld slurmd slurm-client munge"; done; \
	for t in slurmdbd mariadbd; do command -v $$t >/dev/null || [ -x /usr/sbin/$$t ] || missing="$$missing slurmdbd mariadb-server"; done; \
	command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$(echo $$missing | tr ' ' '\n' | sort -u); \
	fi
	touch $@

demo: setup
	$(VENV)/bin/jobpulse demo

# Tiers, failing fast: lint and types beside the unit tests (one core each) and the newer Slurm
# chroots (built once, then kept: mostly download), then everything that starts servers and
# processes (pg, system, slurm, citus, packaging) in parallel; each run prints where its time went.
test: setup
	$(MAKE) --no-print-directory -j3 -O lint unit chroots
	$(PY) -m pytest -m "not unit" -n $(JOBS) --dist loadfile --no-loadscope-reorder --durations=25

unit: setup
	$(PY) -m pytest -m unit -x -q --durations=5

lint: setup
	$(VENV)/bin/ruff check .
	@mkdir -p .typecheck/jobpulse && for p in agent collector schema; do ln -sfn ../../$$p .typecheck/jobpulse/$$p; done
	MYPYPATH=.typecheck $(VENV)/bin/mypy -p jobpulse.schema -p jobpulse.agent -p jobpulse.collector

# Slurm 24.11 and 26.05 for the Slurm tier: Debian trixie and sid chroots under ~/.cache/jobpulse
# (as root; rebuilt when their package list changes; elsewhere the tests that need them skip).
chroots: setup
	$(PY) -m tests.slurm_chroot

bench: setup
	$(PY) -m bench

clean:
	rm -rf $(VENV) build *.egg-info .typecheck
