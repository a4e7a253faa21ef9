#!/usr/bin/env bash
# Builds the encore wheel into a venv with Ray and PySpark (.venv-scale-out) and runs
# crates/python/tests/test_scale_out.py: Ray Data and Spark mapInPandas embeddings must equal the
# single-process ones bit for bit. Too heavy for CI (Ray and a JVM on two cores); run it by hand.
# Needs Java 17+ for Spark.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ENCORE_SCALE_OUT_VENV:-$PWD/.venv-scale-out}"
REQ=crates/python/requirements-scale-out.txt
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! cmp -s "$REQ" "$VENV/.requirements-installed"; then
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q -r "$REQ"
  cp "$REQ" "$VENV/.requirements-installed"
fi
rm -rf target/wheels-scale-out
"$VENV/bin/maturin" build --release --locked -m crates/python/Cargo.toml -i "$VENV/bin/python" -o target/wheels-scale-out
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --force-reinstall --no-deps target/wheels-scale-out/encore-*.whl
"$VENV/bin/python" -m pytest -v -p no:cacheprovider crates/python/tests/test_scale_out.py "$@"
