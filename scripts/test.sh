#!/usr/bin/env bash
# Every test, Rust and Python, in one command. It sets up what the Python tests need in a
# project-local virtual environment (.venv, reused when present): maturin, pytest, ruff, numpy,
# PyTorch, Lightning and PySpark from PyPI (CPU is enough; about 5 GB the first time), and
# Debian's Java runtime for Spark when there is no `java`; then builds and installs the
# poolsight wheel into it, runs the HTML report's browser tests (installing Debian's chromium
# and playwright-core when missing) and pytest. Chainer gets its own environment
# (.venv-chainer: it needs numpy < 2), and an older PyTorch for fake_cuda's tests its own
# (.venv-torch-2.10).
#
#   scripts/test.sh            everything
#   scripts/test.sh --rust     only `cargo test --workspace`
#   scripts/test.sh --python   only the Python side (builds the wheel)
set -euo pipefail
cd "$(dirname "$0")/.."

want_rust=1
want_python=1
case "${1:-}" in
  --rust) want_python=0 ;;
  --python) want_rust=0 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--rust|--python]" >&2; exit 2 ;;
esac

if [ "$want_rust" = 1 ]; then
  echo "== cargo test --workspace (after building the C ABI's shared library, which its test links)"
  cargo build --quiet -p poolsight-capi
  cargo test --workspace
fi

[ "$want_python" = 1 ] || exit 0

# No cache of the downloads (PyTorch's are 4.6 GB): the environments are reused instead.
export PIP_NO_CACHE_DIR=1
VENV="${POOLSIGHT_VENV:-.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PY" -m venv "$VENV"
fi
echo "== Python test dependencies into $VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-test.txt

# The Spark test (python/tests/test_spark.py) needs a Java runtime, 17 or later for Spark 4:
# Debian's openjdk-17-jre-headless (else the newest openjdk-*-jre-headless apt offers) when
# there is none. When none can be had, this says why and the test is skipped, saying why too.
ensure_java() {
  if [ -n "${JAVA_HOME:-}" ] || command -v java >/dev/null 2>&1; then
    return 0
  fi
  local skipping="the Spark test will be skipped"
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "no Java runtime (Debian: apt-get install openjdk-17-jre-headless, as root): $skipping"
    return 0
  fi
  local log=/tmp/poolsight-java-install.log offered pkg=""
  echo "installing a Java runtime for the Spark test (apt-get)..."
  if ! apt-get update -qq >"$log" 2>&1; then
    echo "apt-get update failed (see $log): $skipping"
    return 0
  fi
  offered=$(apt-cache search --names-only '^openjdk-[0-9]+-jre-headless$' 2>>"$log" \
    | cut -d' ' -f1 | sort -t- -k2,2n || true)
  for candidate in openjdk-17-jre-headless openjdk-21-jre-headless; do
    if grep -qx "$candidate" <<<"$offered"; then pkg=$candidate; break; fi
  done
  [ -n "$pkg" ] || pkg=$(tail -n 1 <<<"$offered")
  if [ -z "$pkg" ]; then
    echo "apt offers no openjdk-*-jre-headless: $skipping"
    return 0
  fi
  # Slim Debian images lack the man directory the JRE's postinst links into.
  mkdir -p /usr/share/man/man1
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" \
    >>"$log" 2>&1 && command -v java >/dev/null 2>&1; then
    echo "installed $pkg"
  else
    echo "apt-get install $pkg failed (see $log): $skipping"
  fi
}
echo "== a Java runtime for Apache Spark"
ensure_java

echo "== building and installing the poolsight wheel"
rm -rf target/wheels
# The README's two lines, as written, with the environment's maturin and python first on PATH.
(
  export PATH="$(cd "$VENV" && pwd)/bin:$PATH"
  maturin build --manifest-path python/Cargo.toml --out target/wheels
  python -m pip install --force-reinstall --no-deps target/wheels/poolsight-*.whl
)

CHAINER_VENV="${POOLSIGHT_CHAINER_VENV:-.venv-chainer}"
if [ -f python/requirements-chainer.txt ]; then
  if [ ! -x "$CHAINER_VENV/bin/python" ]; then
    echo "== creating $CHAINER_VENV (Chainer 7.8.1 needs numpy < 2)"
    "$PY" -m venv "$CHAINER_VENV"
  fi
  "$CHAINER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "setuptools<70" wheel
  "$CHAINER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation -r python/requirements-chainer.txt
  "$CHAINER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps target/wheels/poolsight-*.whl
  case "$CHAINER_VENV" in
    /*) export POOLSIGHT_CHAINER_PYTHON="$CHAINER_VENV/bin/python" ;;
    *) export POOLSIGHT_CHAINER_PYTHON="$PWD/$CHAINER_VENV/bin/python" ;;
  esac
fi

# fake_cuda and `poolsight predict` on an older PyTorch too (python/requirements-torch-older.txt).
OLDER_VENV="${POOLSIGHT_OLDER_TORCH_VENV:-.venv-torch-2.10}"
if [ ! -x "$OLDER_VENV/bin/python" ]; then
  echo "== creating $OLDER_VENV (fake_cuda's tests on an older PyTorch)"
  "$PY" -m venv "$OLDER_VENV"
fi
"$OLDER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r python/requirements-torch-older.txt
"$OLDER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps target/wheels/poolsight-*.whl

echo "== browser tests of the HTML report (headless Chromium; skipped with a reason when unavailable)"
scripts/browser-tests.sh

echo "== pytest"
"$VENV/bin/python" -m pytest -q -rs python/tests

echo "== pytest: fake_cuda and predict on $("$OLDER_VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
"$OLDER_VENV/bin/python" -m pytest -q -rs -p no:cacheprovider python/tests/test_fake_cuda.py python/tests/test_predict.py
