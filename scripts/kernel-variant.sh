#!/usr/bin/env bash
# A variant of the GPU kernels as a fat binary, for `INFGRAM_CUDA_KERNELS=FILE` (one infgram
# binary then measures the built-in kernels against the variant on the same GPU, run after
# run): src/neural/gpu/kernels.cu and the files it includes (kernels/*.cu, *.cuh) with PATCH
# applied (a patch of paths under src/neural/gpu/, or `-` for none), compiled as build.rs
# compiles it, with the nvcc of scripts/build-cuda.sh (run it once first) and any further nvcc
# flags (-DMANY_MIN_BLOCKS=1, -DLOAD_BATCH=4, …). Needs no GPU to build; the fat binary runs on
# a machine with one (scripts/device-check.sh, INFGRAM_VARIANTS).
#
#   bash scripts/kernel-variant.sh scripts/kernel-variants/scatter-sums.patch scatter.fatbin
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 PATCH|- OUT.fatbin [NVCC_FLAGS...]" >&2; exit 2; }
patch=$1 out=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
toolchain=$root/target/cuda-toolchain
[ -x "$toolchain/venv/bin/python" ] || {
    echo "kernel-variant: no nvcc yet; run bash scripts/build-cuda.sh once (it fetches it)" >&2
    exit 1
}
cuda=$("$toolchain/venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/neural/gpu"
cp -R "$root/src/neural/gpu/kernels.cu" "$root/src/neural/gpu/kernels" "$work/src/neural/gpu/"
if [ "$patch" != - ]; then
    patch_file=$(cd "$(dirname "$patch")" && pwd)/$(basename "$patch")
    (cd "$work" && patch -s -p1 <"$patch_file") || {
        echo "kernel-variant: $patch does not apply to src/neural/gpu/ as it is now" >&2
        exit 1
    }
fi
cap=${CUDA_COMPUTE_CAP:-90}
"$cuda/bin/nvcc" --fatbin -O3 --compress-mode=size \
    "-gencode=arch=compute_$cap,code=sm_$cap" "-gencode=arch=compute_$cap,code=compute_$cap" \
    "$@" -o "$work/variant.fatbin" "$work/src/neural/gpu/kernels.cu"
mv "$work/variant.fatbin" "$out"
echo "kernel-variant: $out (INFGRAM_CUDA_KERNELS=$out loads it in place of the built-in kernels)"
