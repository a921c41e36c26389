#!/usr/bin/env bash
# Install Chromium (Debian's package `chromium`) for tests/integration/test_leaderboard_html.py, which opens the leaderboard's
# self-contained HTML page (results/tables/leaderboard.html) headless, checks its tables and takes a screenshot.
# Idempotent: nothing is installed when `chromium` is already on PATH. Exits 1 when it cannot install (not root and
# no passwordless sudo, no apt-get, no network); the test then skips, or fails when CI is set.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
    echo "install_chromium: ok ($(command -v chromium))"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_chromium: no apt-get on this machine: install Chromium by hand (the test looks for \`chromium\`)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install_chromium: not root and no passwordless sudo: run \`sudo apt-get install chromium\`" >&2
        exit 1
    fi
fi
echo "install_chromium: installing chromium with apt-get (about 100 MB)"
$SUDO apt-get -o DPkg::Lock::Timeout=600 update
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y chromium
command -v chromium >/dev/null 2>&1 || { echo "install_chromium: apt-get ran but no chromium on PATH" >&2; exit 1; }
echo "install_chromium: ok ($(command -v chromium))"
