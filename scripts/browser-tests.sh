#!/bin/sh
# End-to-end tests of the HTML report in headless Chromium (tests/browser/).
# Needs Debian's chromium and Node.js with npm; installs what is missing (chromium with
# apt-get, playwright-core from npm, pinned by tests/browser/package-lock.json). When they
# cannot be had, prints why and exits 0: a skip, not a failure.
set -eu
cd "$(dirname "$0")/.."

skip() {
    echo "browser tests skipped: $*"
    exit 0
}

CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing chromium (apt-get)..."
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
            >/tmp/poolsight-chromium-install.log 2>&1 \
            || skip "apt-get install chromium failed (see /tmp/poolsight-chromium-install.log)"
    fi
    [ -x "$CHROMIUM" ] || skip "no chromium at $CHROMIUM (Debian: apt-get install chromium, as root)"
fi
command -v node >/dev/null 2>&1 || skip "no node (Node.js 20 or later)"
command -v npm >/dev/null 2>&1 || skip "no npm"

if [ ! -d tests/browser/node_modules/playwright-core ]; then
    (cd tests/browser && npm ci --no-audit --no-fund --silent) \
        || skip "npm ci failed: playwright-core could not be installed"
fi

cargo build --quiet --bin poolsight
POOLSIGHT_BIN="$PWD/target/debug/poolsight" CHROMIUM="$CHROMIUM" \
    node --test tests/browser/report.test.mjs
