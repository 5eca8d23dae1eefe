#!/usr/bin/env bash
# Wheels of the poolsight Python package for any Linux: manylinux2014 (glibc 2.17 and later)
# for x86_64 and aarch64, cross-compiled with maturin and zig (both from PyPI, installed into a
# build environment of their own), each checked with `auditwheel show`. One abi3 wheel per
# architecture serves every CPython >= 3.9.
#
#   scripts/wheels.sh                 both architectures, into target/manylinux (scripts/test.sh
#                                     empties target/wheels: its own, host-only wheel)
#   scripts/wheels.sh x86_64          one (x86_64 or aarch64)
#   WHEELS_OUT=dist scripts/wheels.sh another output folder
#
# Needs the Rust toolchain and the standard library of each target
# (`rustup target add aarch64-unknown-linux-gnu`): a target whose standard library cannot be
# had is refused with the reason, and the script fails.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${WHEELS_OUT:-target/manylinux}"
TOOLS="${WHEELS_VENV:-target/wheel-tools}"
# Absolute: maturin hands zig's command (this environment's python -m ziglang) to wrappers that
# compilers of C dependencies run from their own build folders.
case "$TOOLS" in /*) ;; *) TOOLS="$PWD/$TOOLS" ;; esac
PY="${PYTHON:-python3}"

arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(x86_64 aarch64)
for arch in "${arches[@]}"; do
  case "$arch" in
    x86_64 | aarch64) ;;
    *) echo "usage: scripts/wheels.sh [x86_64] [aarch64] (not '$arch')" >&2; exit 2 ;;
  esac
done

if [ ! -x "$TOOLS/bin/python" ]; then
  echo "== build tools (maturin, ziglang, auditwheel) into $TOOLS"
  "$PY" -m venv "$TOOLS"
fi
"$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check \
  'maturin>=1.9,<2' ziglang auditwheel

# The standard library of a target, installed when rustup can fetch it.
have_std() {
  local target=$1
  if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    return 0
  fi
  if ! command -v rustup >/dev/null 2>&1; then
    echo "no rustup: cannot install the standard library of $target" >&2
    return 1
  fi
  echo "== rustup target add $target"
  rustup target add "$target"
}

mkdir -p "$OUT"
failed=()
for arch in "${arches[@]}"; do
  target="$arch-unknown-linux-gnu"
  if ! have_std "$target"; then
    echo "poolsight: no $arch wheel: the Rust standard library for $target is not installed" \
      "and could not be installed (rustup target add $target)" >&2
    failed+=("$arch")
    continue
  fi
  echo "== manylinux2014 wheel for $arch"
  # maturin finds zig through the ziglang package of its own environment; profile `wheel`
  # (python/pyproject.toml) is release without debug info.
  PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/maturin" build --manifest-path python/Cargo.toml \
    --target "$target" --zig --compatibility manylinux2014 --out "$OUT"
  wheel=$(ls -t "$OUT"/poolsight-*manylinux2014_"$arch"*.whl | head -n 1)
  echo "== auditwheel show $wheel"
  "$TOOLS/bin/auditwheel" show "$wheel"
  # The policy auditwheel finds must be manylinux2014 (glibc 2.17) or older.
  if ! "$TOOLS/bin/auditwheel" show "$wheel" | tr -s ' \n' ' ' \
    | grep -Eq 'platform tag: "manylinux_2_(5|12|17)_'"$arch"'"'; then
    echo "poolsight: $wheel is not manylinux2014-compatible (see auditwheel show above)" >&2
    failed+=("$arch")
    continue
  fi
  ls -l "$wheel"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "poolsight: no wheel for: ${failed[*]}" >&2
  exit 1
fi
