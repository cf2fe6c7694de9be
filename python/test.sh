#!/usr/bin/env bash
# The Python package's tests: makes a virtual environment
# (target/python-venv, or $PORTCULLIS_PY_VENV), builds and installs the
# package into it with its test extras (maturin develop --release: the
# native module optimised, as users get it), type-checks the package, its
# examples and tests with mypy --strict, and runs pytest against the real
# gateway: $PORTCULLIS_BIN, or the release build made here, the one the .deb
# ships and the bench runs (so CI builds it once for all three). Exits
# non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
venv=${PORTCULLIS_PY_VENV:-../target/python-venv}

if [ -z "${PORTCULLIS_BIN:-}" ]; then
  bash ../packaging/build-release.sh
  PORTCULLIS_BIN=$(cd .. && pwd)/target/release/portcullis
  export PORTCULLIS_BIN
fi
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
pip install --quiet --disable-pip-version-check "maturin>=1.7,<2"
maturin develop --release --locked --extras test --quiet
mypy portcullis examples tests bench.py
python -m pytest -q "$@"
