#!/usr/bin/env bash
# The README's test command: the system programs the integration tests drive (Chromium for
# the browser checks; Prometheus, VictoriaMetrics and Alertmanager servers on 127.0.0.1),
# the package with its test extra, ruff and mypy (config in pyproject.toml), then the whole
# suite: the tests that measure real training processes alone, the rest in parallel workers.
# Extra arguments go to pytest instead (one plain run).
# Tests whose program could not be installed (no root, no apt) skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
# Bytecode caches for the checkout (git ignores __pycache__): with PYTHONDONTWRITEBYTECODE set,
# as on these machines, every Python process the suite starts compiled the package's
# sources again (~0.2 s for the processor's imports) and each pytest process rewrote and
# compiled every test module (collection 8.4 s instead of 4.8 s).
unset PYTHONDONTWRITEBYTECODE

need=()
for pair in chromium:chromium prometheus:prometheus victoria-metrics:victoria-metrics \
            prometheus-alertmanager:prometheus-alertmanager promtool:prometheus; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair##*:}")
done
if ((${#need[@]})); then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=$(command -v sudo || true)
  if [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; then
    echo "installing ${need[*]}" >&2
    $sudo apt-get install -y --no-install-recommends "${need[@]}" \
      || { $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "${need[@]}"; }
  else
    echo "cannot install ${need[*]} (not root): their tests will be skipped" >&2
  fi
fi

pip install -e '.[test]'
python -m ruff check argus tests
# mypy's cache outside the clone, like pip's: a clean clone re-checks only the files whose
# content changed (mypy validates every cached file by its hash). Cold, the whole package
# takes ~30 s of the CI's 20 minutes; warm, under a second.
export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/argus/mypy}"
python -m mypy
if (($#)); then
  exec python -m pytest -q "$@"
fi
# The tests that run real training processes and measure them (marked `serial` in
# tests/conftest.py) run alone; the rest first, in parallel workers (one per core, at most 4),
# a module's tests that share a module fixture on one worker (tests/conftest.py).
workers=$(nproc 2>/dev/null || echo 2)
((workers > 4)) && workers=4
((workers < 2)) && workers=2
rc=0
# --durations: where CI time goes, in every CI log (the 20-minute budget)
python -m pytest -q -n "$workers" --dist loadgroup -m "not serial" --durations=15 || rc=$?
python -m pytest -q -m serial --durations=25 || rc=$?
exit "$rc"
