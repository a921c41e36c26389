#!/usr/bin/env bash
# Install KenLM for bpdbench: the lmplz/build_binary tools (built from the kenlm==0.3.0 PyPI sdist against Debian's
# Boost) and the `kenlm` Python module in $VENV (default .venv). Idempotent: each step is skipped when its result
# already exists. Recipe and timings: shared/kenlm.md (about 2.5 min from scratch on 2 cores).
set -euo pipefail

cd "$(dirname "$0")/.."                         # repo root: every path below is repo-relative
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
KENLM_VERSION="0.3.0"
KENLM_MAX_ORDER="${KENLM_MAX_ORDER:-6}"
CACHE=".cache/kenlm"
SDIST="$CACHE/kenlm-$KENLM_VERSION.tar.gz"
JOBS="${JOBS:-2}"

if [ ! -x "$PY" ]; then
    echo "install_kenlm: no Python at $PY (set VENV=path/to/venv)" >&2
    exit 1
fi

# 1. Build dependencies. CMake's Boost lookup needs unit_test_framework too, hence libboost-test-dev.
if ! dpkg -s libboost-program-options-dev >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "install_kenlm: installing Boost/cmake build dependencies with apt-get"
    $SUDO apt-get -o DPkg::Lock::Timeout=600 update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y --no-install-recommends \
        build-essential cmake libboost-program-options-dev libboost-system-dev libboost-thread-dev \
        libboost-test-dev zlib1g-dev libbz2-dev liblzma-dev
fi

# 2. The sdist (--no-binary kenlm only: --no-binary :all: would build cmake from source too).
mkdir -p "$CACHE"
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download --no-deps --no-binary kenlm -d "$CACHE" "kenlm==$KENLM_VERSION"
fi

# 3. lmplz + build_binary.
if [ ! -x "$CACHE/build/bin/lmplz" ] || [ ! -x "$CACHE/build/bin/build_binary" ]; then
    rm -rf "$CACHE/src"
    mkdir -p "$CACHE/src"
    tar xzf "$SDIST" -C "$CACHE/src" --strip-components=1
    cmake -S "$CACHE/src" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release -DKENLM_MAX_ORDER="$KENLM_MAX_ORDER"
    cmake --build "$CACHE/build" -j"$JOBS" --target lmplz build_binary
fi

# 4. The Python module (compiles for about a minute; pip caches the built wheel afterwards).
if ! "$PY" -c "import kenlm" >/dev/null 2>&1; then
    "$PY" -m pip install "$SDIST"
fi

"$PY" -c "import kenlm" 
echo "install_kenlm: ok ($CACHE/build/bin/lmplz, $CACHE/build/bin/build_binary, kenlm module in $VENV)"
