#!/usr/bin/env bash
# The whole test suite, as the README and CI run it (.ci/run calls this script).
#
#   bash scripts/test.sh [pytest args...]
#
# Needs only python3 (3.11+), Java 17+ and Maven on the machine. It creates .venv if
# missing, installs the project with its test extras, starts ONE Kafka broker for the run
# (scripts/kafka.sh, state in a temp dir), runs ruff, mypy and pytest, always stops the
# broker, prints the broker log tail when pytest failed, and exits with pytest's status
# (ruff or mypy failing also fails the run; "no tests collected" counts as a failure).
#
# Environment: PYTHON (default python3), FLEETPULSE_KAFKA_* (see scripts/kafka.sh),
# FLEETPULSE_SKIP_INSTALL=1 to reuse .venv as it is (quick local reruns),
# FLEETPULSE_TEST_WORKERS (pytest-xdist workers, default 2; 0: one process).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
T_START=$SECONDS

step() { printf '\n==> %s\n' "$*"; }

# ------------------------------------------------------------------ system packages
# (place for install steps of system packages that tests need, e.g. a browser:)
# >>> system installs (add below, keep idempotent and quiet) >>>
# Headless Chromium and its driver for the web page tests (tests/test_web_*.py,
# tests/test_demo_web.py); Debian packages, skipped when both are already there.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    step "system packages: chromium, chromium-driver"
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""
        [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "scripts/test.sh: no apt-get; install chromium and chromedriver yourself" >&2
    fi
fi
# Debian's Alertmanager for tests/test_alertmanager.py (the shipped deploy/alertmanager.yml
# run for real); skipped when it is already there.
if ! command -v prometheus-alertmanager >/dev/null 2>&1; then
    step "system packages: prometheus-alertmanager"
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""
        [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus-alertmanager >/dev/null
    else
        echo "scripts/test.sh: no apt-get; install prometheus-alertmanager yourself" >&2
    fi
fi
# Debian's Prometheus (promtool too) and VictoriaMetrics for tests/test_remote_read.py,
# tests/test_scrape.py and tests/test_remote_write.py; skipped when both are there.
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1 \
        || ! command -v victoria-metrics >/dev/null 2>&1; then
    step "system packages: prometheus, victoria-metrics"
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""
        [[ "$(id -u)" -ne 0 ]] && SUDO="sudo"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq prometheus victoria-metrics >/dev/null
    else
        echo "scripts/test.sh: no apt-get; install prometheus and victoria-metrics yourself" >&2
    fi
fi
# <<< system installs <<<

# ------------------------------------------------------------------ python environment
step "python environment ($VENV)"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
if [[ "${FLEETPULSE_SKIP_INSTALL:-0}" != "1" ]]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
fi
# >>> extra python-side install steps (add below) >>>
# <<< extra python-side install steps <<<
T_INSTALLED=$SECONDS

# ------------------------------------------------------------------ Kafka broker
KAFKA_DIR="$(mktemp -d "${TMPDIR:-/tmp}/fleetpulse-kafka.XXXXXX")"
stop_broker() {
    bash "$ROOT/scripts/kafka.sh" stop --dir "$KAFKA_DIR" || true
    rm -rf "$KAFKA_DIR"
}
trap stop_broker EXIT
step "Kafka broker (state in $KAFKA_DIR)"
T_KAFKA=$SECONDS
if ! BOOTSTRAP="$(bash "$ROOT/scripts/kafka.sh" start --dir "$KAFKA_DIR" --owner $$ | tail -n 1)" \
        || [[ -z "$BOOTSTRAP" ]]; then
    echo "scripts/test.sh: the Kafka broker did not start; Kafka tests cannot run" >&2
    exit 1
fi
KAFKA_START_S=$((SECONDS - T_KAFKA))
export FLEETPULSE_KAFKA_BOOTSTRAP="$BOOTSTRAP"
export FLEETPULSE_KAFKA_LOG="$KAFKA_DIR/server.log"
export FLEETPULSE_KAFKA_SASL_BOOTSTRAP="$(cat "$KAFKA_DIR/sasl_bootstrap")"
export FLEETPULSE_KAFKA_TLS_BOOTSTRAP="$(cat "$KAFKA_DIR/tls_bootstrap")"
export FLEETPULSE_KAFKA_TLS_CAFILE="$KAFKA_DIR/ca.pem"
echo "Kafka at $BOOTSTRAP (started in ${KAFKA_START_S}s)"

# ------------------------------------------------------------------ checks
status=0
step "ruff"
"$VENV/bin/ruff" check . || status=1
step "mypy"
"$VENV/bin/mypy" || status=1

step "pytest"
set +e
# Two workers, a file per worker at a time (--dist loadfile: a file's module fixtures and
# order stay together). Most of the suite's time is waiting on real brokers, outages and
# processes, so two workers on two cores overlap the waits; every test uses its own topic
# prefix, temp dirs and ports. FLEETPULSE_TEST_WORKERS=0 runs in one process.
# The twenty slowest tests are listed at the end: the suite must stay under 15 minutes, and
# the list says where the time goes before a new test pushes it over.
WORKERS="${FLEETPULSE_TEST_WORKERS:-2}"
if [[ "$WORKERS" == "0" ]]; then
    "$VENV/bin/python" -m pytest --durations=20 "$@"
else
    "$VENV/bin/python" -m pytest -n "$WORKERS" --dist loadfile --durations=20 "$@"
fi
pytest_status=$?
set -e
if [[ $pytest_status -eq 5 ]]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
fi
if [[ $pytest_status -ne 0 ]]; then
    echo
    echo "==> pytest failed (exit $pytest_status); last lines of the Kafka broker log:"
    tail -n 80 "$FLEETPULSE_KAFKA_LOG" 2>/dev/null || echo "(no broker log)"
fi

echo
echo "==> timing: install $((T_INSTALLED - T_START))s, Kafka start ${KAFKA_START_S}s, total $((SECONDS - T_START))s"
if [[ $pytest_status -ne 0 ]]; then
    exit "$pytest_status"
fi
if [[ $status -ne 0 ]]; then
    echo "scripts/test.sh: ruff or mypy failed" >&2
    exit 1
fi
echo "scripts/test.sh: all checks passed"
