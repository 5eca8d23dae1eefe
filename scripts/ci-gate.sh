#!/bin/sh
# poolsight as a CI gate, in plain POSIX shell for any CI: record the same short run on the base
# revision and on the change, with one poolsight build for both, then fail the job when
# `poolsight diff` finds that memory or time grew past your rules.
#
#   BASE=<rev> HEAD=<rev> RECORD='<your training command>' scripts/ci-gate.sh [DIFF OPTIONS...]
#
# RECORD runs from the root of a checkout of each revision (a git worktree, so the tree this
# script runs from is never switched) and must write its trace to "$POOLSIGHT_TRACE":
# `python train.py --steps 50`, with `poolsight.record(os.environ["POOLSIGHT_TRACE"])` inside.
# DIFF OPTIONS default to `--rules poolsight-rules.toml` when the change has that file, else
# `--fail-on peak_used>+5%`.
#
# Environment: RUNS (runs per side, default 3: time rules compare medians), OUT (where traces
# and the report go, default ./poolsight-gate), POOLSIGHT (the command; when it is not found,
# the script installs poolsight from this repository with `pip install ./python`).
#
# Exit status: 0 no rule crossed, 1 a rule crossed (listed in $OUT/diff.md), 2 bad input: a
# revision that does not exist, a run that failed or left a partial trace.
set -u

die() {
    echo "ci-gate: $*" >&2
    exit 2
}

: "${BASE:?set BASE to the base revision (e.g. the merge base of the pull request)}"
: "${HEAD:?set HEAD to the revision under test}"
: "${RECORD:?set RECORD to the command that runs your training and records \$POOLSIGHT_TRACE}"
RUNS=${RUNS:-3}
OUT=${OUT:-poolsight-gate}
POOLSIGHT=${POOLSIGHT:-poolsight}
HERE=$(cd "$(dirname "$0")/.." && pwd)

if ! command -v "$POOLSIGHT" >/dev/null 2>&1; then
    echo "ci-gate: installing poolsight from $HERE (pip install ./python)" >&2
    python3 -m pip install --quiet "$HERE/python" || die "could not install poolsight"
    POOLSIGHT=poolsight
fi

mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
rm -f "$OUT"/base-*.pstrace "$OUT"/new-*.pstrace
TREES=$(mktemp -d) || die "mktemp failed"
cleanup() {
    for side in base new; do
        [ -d "$TREES/$side" ] && git worktree remove --force "$TREES/$side" >/dev/null 2>&1
    done
    rm -rf "$TREES"
}
trap cleanup EXIT

record() { # $1: base|new, $2: revision
    git worktree add --quiet --detach "$TREES/$1" "$2" 2>/dev/null \
        || die "no revision $2 for the $1 side"
    i=1
    while [ "$i" -le "$RUNS" ]; do
        trace="$OUT/$1-$i.pstrace"
        (cd "$TREES/$1" && POOLSIGHT_TRACE="$trace" sh -c "$RECORD") >"$OUT/$1-$i.log" 2>&1 \
            || die "the $1 run $i failed (its output: $OUT/$1-$i.log)"
        [ -f "$trace" ] || die "the $1 run $i wrote no trace at \$POOLSIGHT_TRACE"
        i=$((i + 1))
    done
}

record base "$BASE"
record new "$HEAD"

if [ "$#" -eq 0 ]; then
    if [ -f "$TREES/new/poolsight-rules.toml" ]; then
        set -- --rules "$TREES/new/poolsight-rules.toml"
    else
        set -- --fail-on 'peak_used>+5%'
    fi
fi

# shellcheck disable=SC2086 # the globs name the runs of each side
"$POOLSIGHT" diff --base "$OUT"/base-*.pstrace --new "$OUT"/new-*.pstrace "$@" \
    --format markdown --top 15 --flamegraph "$OUT/diff.svg" >"$OUT/diff.md"
status=$?
cat "$OUT/diff.md"
exit "$status"
