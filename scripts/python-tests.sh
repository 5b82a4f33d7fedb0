#!/usr/bin/env bash
# The Python package's tests (docs/python.md): builds the wheel with maturin
# from the tests' cargo profile and build cache, installs it into a fresh
# virtualenv and runs the API and lineage tests with pytest against DuckDB
# and PostgreSQL; then the Dagster and Airflow tests, each in a virtualenv
# of its own (kept in ~/.cache/fixpoint, the wheel reinstalled each time).
#
#   scripts/python-tests.sh [api] [dagster] [airflow]    # default: all three
#
# Under CI=true a missing service or package fails the tests; otherwise
# they say `skipped`.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fixpoint/target}"
cache="${FIXPOINT_PY_CACHE:-$HOME/.cache/fixpoint}"
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(api dagster airflow)
want() { local s; for s in "${suites[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

# The packages every test virtualenv gets. duckdb is pinned to the DuckDB
# fixpoint bundles: the tests recompute its fingerprints with hash().
duckdb_version=$(sed -n '/^name = "libduckdb-sys"$/{n;s/^version = "1\.\([0-9]*\)\.\([0-9]*\)"$/\1/p}' Cargo.lock)
duckdb_pin="duckdb==$((duckdb_version / 10000)).$(((duckdb_version / 100) % 100)).$((duckdb_version % 100))"
test_deps=(pytest jsonschema referencing "psycopg[binary]" blake3 "$duckdb_pin")

venv() { # venv DIR PACKAGES...: a virtualenv at DIR with PACKAGES
  local dir=$1; shift
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check "$@"
}

# 1. The wheel, from the same cargo profile (dev) as the tests.
tools="$cache/pytools"
venv "$tools" "maturin>=1.5,<2"
dist=$(mktemp -d)
trap 'rm -rf "$dist"' EXIT
"$tools/bin/maturin" build --profile dev --compatibility linux --out "$dist" --quiet
wheel=$(ls "$dist"/fixpoint-*.whl)
echo "python-tests: built $(basename "$wheel")"

run_pytest() { # run_pytest VENV FILES...
  local py=$1/bin/python; shift
  (cd "$repo/python/tests" && "$py" -m pytest -p no:cacheprovider -q "$@")
}

# 2. The API and lineage tests, in a fresh virtualenv.
if want api; then
  api="$dist/venv-api"
  venv "$api" "$wheel" "${test_deps[@]}"
  run_pytest "$api" test_api.py test_lineage.py
fi

# 3. Dagster.
if want dagster; then
  dag="$cache/pydagster"
  venv "$dag" dagster "${test_deps[@]}"
  "$dag/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
  run_pytest "$dag" test_dagster.py
fi

# 4. Airflow: a metadata database (SQLite) of its own, no scheduler.
if want airflow; then
  af="$cache/pyairflow"
  venv "$af" "apache-airflow>=3,<4" "${test_deps[@]}"
  "$af/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
  export AIRFLOW_HOME="$dist/airflow"
  export AIRFLOW__CORE__DAGS_FOLDER="$AIRFLOW_HOME/dags"
  export AIRFLOW__CORE__LOAD_EXAMPLES=False
  mkdir -p "$AIRFLOW__CORE__DAGS_FOLDER"
  "$af/bin/airflow" db migrate > "$dist/airflow-migrate.log" 2>&1 || { tail -40 "$dist/airflow-migrate.log"; exit 1; }
  run_pytest "$af" test_airflow.py
fi
