#!/usr/bin/env bash
# Install llama-cpp-python (for `qdraft:runtime=gguf`) compiled for this CPU's instruction sets, AMX left out.
#
# Why not GGML_NATIVE: on an Intel Xeon with AMX (a VM, flags amx_bf16 amx_int8 amx_tile), the native build of
# llama-cpp-python 0.3.36 died with SIGILL at `tilezero` in ggml_backend_amx_mul_mat, in a worker thread, on the first
# forward of the 0.5B model, even with the process's AMX permission granted (arch_prctl). So the flags come from
# /proc/cpuinfo, one GGML option each, and the AMX options stay off. The flags are recorded beside the venv, and a
# build made with other flags (an older native build, or another CPU's venv) is rebuilt.
# About 10 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
VERSION="0.3.36"

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]]; }
opts="-DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
for pair in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI avx512f:AVX512 \
            avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if has "${pair%%:*}"; then opts="$opts -DGGML_${pair##*:}=ON"; else opts="$opts -DGGML_${pair##*:}=OFF"; fi
done
opts="$opts -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
opts="$opts -DLLAMA_BUILD_SERVER=OFF"
stamp="$VENV/llamacpp-$VERSION.cmake"

if "$PY" -c "import llama_cpp" 2>/dev/null && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$opts" ]; then
    exit 0
fi
echo "install_llamacpp: compiling llama-cpp-python $VERSION for this CPU (about 10 min on 2 cores): $opts"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="$opts" "$PY" -m pip install -q --no-cache-dir --force-reinstall \
    --no-deps "llama-cpp-python==$VERSION"
"$PY" -m pip install -q "llama-cpp-python==$VERSION"       # its dependencies, if the forced build skipped any
echo "$opts" > "$stamp"
