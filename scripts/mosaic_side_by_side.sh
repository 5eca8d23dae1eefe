#!/bin/sh
# poolsight next to Meta's Mosaic and PyTorch's own `_memory_viz` on the same snapshots: what
# docs/pytorch-files.md ("Side by side") shows, as run.
#
# Usage: scripts/mosaic_side_by_side.sh [-o DIR] [SNAPSHOT.pickle...]
#   (default: the snapshots of fixtures/pytorch/ that a training run writes)
# Each tool that is missing is skipped with the reason, the others still run:
#   - poolsight: $POOLSIGHT, else target/release/poolsight, else `poolsight` on PATH;
#   - Mosaic (github.com/facebookresearch/mosaic, not on PyPI): its commands on PATH
#     (`mosaic_get_memory_usage_peak`, ...), or a checkout named by $MOSAIC_SRC run with
#     $MOSAIC_PYTHON (default $PYTHON; its requirements installed: altair, click, mcp,
#     omegaconf, pandas, tabulate).
#     At its commit 67b27bb `pip install .` fails ("package directory 'cmd' does not exist":
#     setup.py maps the packages to folders the repository does not have), so a checkout is
#     the way to run it;
#   - PyTorch's `torch.cuda._memory_viz` (runs on CPU): $PYTHON with torch installed.
# Writes poolsight's HTML page, Mosaic's category profile and `_memory_viz.trace_plot` of each
# snapshot into DIR (default: a new temporary directory, printed).
set -eu
cd "$(dirname "$0")/.."

OUT=""
if [ "${1:-}" = "-o" ]; then
    OUT=$2
    shift 2
fi
[ -n "$OUT" ] || OUT=$(mktemp -d "${TMPDIR:-/tmp}/side-by-side.XXXXXX")
mkdir -p "$OUT"
if [ $# -eq 0 ]; then
    set -- fixtures/pytorch/snapshot_step_cpp_plain.pickle \
        fixtures/pytorch/snapshot_step_cpp.pickle \
        fixtures/pytorch/snapshot_notebook_oom.pickle \
        fixtures/pytorch/snapshot_oom_dump.pickle
fi

POOLSIGHT=${POOLSIGHT:-}
if [ -z "$POOLSIGHT" ]; then
    if [ -x target/release/poolsight ]; then
        POOLSIGHT=target/release/poolsight
    else
        POOLSIGHT=$(command -v poolsight || true)
    fi
fi
PYTHON=${PYTHON:-python3}
MOSAIC_PYTHON=${MOSAIC_PYTHON:-$PYTHON}

# How to run a Mosaic command (its console script, or the module from a checkout), or why not.
mosaic() {
    cmd=$1
    shift
    if command -v "mosaic_$cmd" >/dev/null 2>&1; then
        "mosaic_$cmd" "$@"
    else
        PYTHONPATH="$MOSAIC_SRC${PYTHONPATH:+:$PYTHONPATH}" "$MOSAIC_PYTHON" -m "mosaic.cmd.$cmd" "$@"
    fi
}
MOSAIC_WHY=""
if command -v mosaic_get_memory_usage_peak >/dev/null 2>&1; then
    :
elif [ -z "${MOSAIC_SRC:-}" ]; then
    MOSAIC_WHY="Mosaic skipped: no mosaic_get_memory_usage_peak on PATH and no MOSAIC_SRC (a checkout of facebookresearch/mosaic)"
elif ! PYTHONPATH="$MOSAIC_SRC" "$MOSAIC_PYTHON" -c "import mosaic.cmd.entry_point" >/dev/null 2>&1; then
    MOSAIC_WHY="Mosaic skipped: $MOSAIC_PYTHON cannot import mosaic.cmd.entry_point from $MOSAIC_SRC (are its requirements installed?)"
fi
TORCH_WHY=""
"$PYTHON" -c "import torch.cuda._memory_viz" >/dev/null 2>&1 \
    || TORCH_WHY="PyTorch's _memory_viz skipped: $PYTHON cannot import torch.cuda._memory_viz"

section() {
    printf '\n--- %s\n' "$*"
}

for f in "$@"; do
    name=$(basename "$f" .pickle)
    printf '\n=== %s\n' "$f"
    if [ -n "$POOLSIGHT" ]; then
        section "poolsight report (its head: what was live at the peak)"
        "$POOLSIGHT" report "$f" | awk '{ print } /^live at the peak/ { p = 1 } p && /^$/ { exit }'
        section "poolsight categories"
        "$POOLSIGHT" categories "$f"
        section "poolsight oom"
        "$POOLSIGHT" oom "$f"
        "$POOLSIGHT" html "$f" -o "$OUT/$name.html" 2>&1
    else
        echo "poolsight skipped: no target/release/poolsight and no poolsight on PATH"
    fi
    if [ -z "$MOSAIC_WHY" ]; then
        section "Mosaic: get_memory_usage_peak"
        mosaic get_memory_usage_peak --snapshot "$f" 2>&1 | grep -v '^INFO:root:Loading'
        section "Mosaic: get_memory_profile --profile categories (writes $name.mosaic.html)"
        mosaic get_memory_profile --snapshot "$f" --profile categories \
            --out-path "$OUT/$name.mosaic.html" 2>&1 | grep -v '^INFO:root:Loading' || true
    else
        echo "$MOSAIC_WHY"
    fi
    if [ -z "$TORCH_WHY" ]; then
        section "PyTorch _memory_viz: segsum (what \`python -m torch.cuda._memory_viz stats\` prints), trace's first lines, trace_plot (writes $name.memviz.html)"
        "$PYTHON" - "$f" "$OUT/$name.memviz.html" <<'EOF'
import pickle
import sys

from torch.cuda import _memory_viz as mv

with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
print(mv.segsum(data))
print("\n".join(mv.trace(data).splitlines()[:12]))
with open(sys.argv[2], "w") as f:
    f.write(mv.trace_plot(data))
EOF
    else
        echo "$TORCH_WHY"
    fi
done
printf '\npages written to %s\n' "$OUT"
