#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench for bench.peers, from the llama-cpp-python sdist pinned in
# requirements-bench.txt (it vendors llama.cpp), into ../peer/ beside the project (never committed). ~6 min on 2 cores.
#   bash bench/build_llama_cpp.sh            -> prints the binaries' directory for --llama-bin
#   bash bench/build_llama_cpp.sh avx2       -> the same for a build limited to AVX2 (build-avx2/): the peer of the
#                                               engine run as on an AVX2-only CPU (bench/formats.py says how)
# Some virtual machines report AMX but stop its tile instructions (llama.cpp's prompt and batch paths then die with
# SIGILL while its batch-1 decode runs): the build is smoke-tested on a short prompt and, if it dies, built again
# with ggml's AMX kernels off (build-noamx/), so batch rows are measured too.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$(realpath ..)/peer
spec=$(grep -E '^llama-cpp-python==' requirements-bench.txt)
ver=${spec#*==}
src="$dest/llama_cpp_python-$ver/vendor/llama.cpp"
gguf=$(python -c "from eagle3.target import default_gguf; print(default_gguf())")

build() {  # build <dir> [cmake flags...]
  local dir=$1; shift
  if [ ! -x "$src/$dir/bin/llama-batched-bench" ]; then
    cmake -S "$src" -B "$src/$dir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_TESTS=OFF "$@" >/dev/null
    cmake --build "$src/$dir" -j"$(nproc)" --target llama-bench llama-batched-bench >/dev/null 2>&1
  fi
}

works() {  # a 16-token prompt through llama-bench: the path that batches rows
  "$src/$1/bin/llama-bench" -m "$gguf" -t 1 -p 16 -n 0 -r 1 >/dev/null 2>&1
}

if [ ! -d "$src" ]; then
  mkdir -p "$dest"
  python -m pip download --quiet --no-deps --no-binary :all: "$spec" -d "$dest"
  tar xzf "$dest/llama_cpp_python-$ver.tar.gz" -C "$dest"
fi
if [ "${1:-}" = avx2 ]; then
  build build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
  works build-avx2 || { echo "llama.cpp's build-avx2 fails" >&2; exit 1; }
  echo "$src/build-avx2/bin"
  exit 0
fi
build build
if works build; then
  echo "$src/build/bin"
  exit 0
fi
echo "llama.cpp's native build dies on a prompt here (AMX?): building build-noamx/ for this CPU's ISA without AMX" >&2
# -march=native would switch AMX back on: name each extension this CPU reports instead.
flags=$(grep -m1 '^flags' /proc/cpuinfo)
isa=(-DGGML_NATIVE=OFF)
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 avx512vbmi:AVX512_VBMI \
            avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if [[ " $flags " == *" ${pair%%:*} "* ]]; then isa+=("-DGGML_${pair#*:}=ON"); fi
done
build build-noamx "${isa[@]}"
works build-noamx || { echo "llama.cpp's build-noamx fails too" >&2; exit 1; }
echo "$src/build-noamx/bin"
