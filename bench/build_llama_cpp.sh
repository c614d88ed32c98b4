#!/usr/bin/env bash
# Build llama.cpp's llama-bench and llama-batched-bench for bench.peers, from the llama-cpp-python sdist pinned in
# requirements-bench.txt (it vendors llama.cpp), into ../peer/ beside the project (never committed). ~6 min on 2 cores.
#   bash bench/build_llama_cpp.sh            -> prints the binaries' directory for --llama-bin
set -euo pipefail
cd "$(dirname "$0")/.."
dest=$(realpath ..)/peer
spec=$(grep -E '^llama-cpp-python==' requirements-bench.txt)
ver=${spec#*==}
src="$dest/llama_cpp_python-$ver/vendor/llama.cpp"
if [ ! -x "$src/build/bin/llama-batched-bench" ]; then
  mkdir -p "$dest"
  python -m pip download --quiet --no-deps --no-binary :all: "$spec" -d "$dest"
  tar xzf "$dest/llama_cpp_python-$ver.tar.gz" -C "$dest"
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF >/dev/null
  cmake --build "$src/build" -j"$(nproc)" --target llama-bench llama-batched-bench >/dev/null
fi
echo "$src/build/bin"
