#!/usr/bin/env bash
# The GPU check of infgram, one command on a machine with an NVIDIA GPU:
#
#   bash scripts/device-check.sh [--bin DIR] MODEL.gguf [MODEL.gguf ...]
#
# DIR holds `infgram` and `bench_decode` built with the `cuda` feature (default:
# target/cuda/release, what `bash scripts/build-cuda.sh` makes; DIR/examples is looked in
# too; target/cuda/dist has them stripped, with the benchmark's corpus, to carry). The models are GGUF files on this machine (SmolLM2-135M-Instruct Q4_1 and
# gemma-3-270m Q4_K_M are the ones BENCHMARKS.md measures; no network is needed). For each model it prints:
# 1. a short generation on the GPU, and the same on the CPU;
# 2. the fused kernels (`--backend native`, the default on a GPU) against their CPU reference
#    and the native CPU pass, and their batch invariance (`bench_decode gpu-check`); the cost
#    of a pass of k = 1…16 new tokens against a one-token step: the fused kernels with CUDA
#    graphs, without (INFGRAM_CUDA_GRAPHS=0), and the candle pass (`--backend candle`); with
#    INFGRAM_VARIANTS="A.fatbin B.fatbin" (scripts/kernel-variant.sh), the same table for each
#    variant of the kernels, then the built-in ones again (the same binary, run after run);
# 3. `bench_decode speculative` on the GPU: plain against speculative decoding on the copy /
#    edit, Shakespeare and open prompt sets, with whether every output equals plain decoding's
#    (the "identical" column: lossless on the device); for a coder model (a file named
#    *coder*, such as qwen2.5-coder-0.5b-instruct-q4_k_m.gguf), `bench_decode edits` too; and
#    `bench_decode batch`: 1, 4 and 16 clients at once, their passes shared on the GPU;
# 4. llama.cpp's llama-bench on the same file (tg128, pp16; from scripts/build-llama-bench.sh,
#    its folder in LLAMA_BENCH_DIR), and the same prompts through Hugging Face transformers on
#    the same GPU, where PyTorch, transformers and gguf are installed (scripts/hf_baseline.py).
# Each step has a time limit, set from a run on an H100 (2026-11-26: about 6 minutes a model,
# the transformers baseline included; the first model also builds the corpus index in its
# tokens). The transformers step needs the `gguf` package (carry its wheel to a GPU image).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$here/target/cuda/release
if [ "${1:-}" = "--bin" ]; then bin=$2; shift 2; fi
[ $# -ge 1 ] || { sed -n 2,20p "$0"; exit 2; }
infgram=$bin/infgram
bench=$bin/bench_decode
[ -x "$bench" ] || bench=$bin/examples/bench_decode
for f in "$infgram" "$bench"; do
    [ -x "$f" ] || { echo "device-check: $f is missing; build with scripts/build-cuda.sh" >&2; exit 2; }
done

# bench_decode's corpus where build-cuda.sh packed it (a GPU machine may have no network).
if [ -f "$bin/corpora.tar.gz" ]; then
    export INFGRAM_CACHE=${INFGRAM_CACHE:-/tmp/infgram-cache}
    mkdir -p "$INFGRAM_CACHE"
    tar -C "$INFGRAM_CACHE" -xzf "$bin/corpora.tar.gz"
fi

# The CUDA libraries: PyTorch's wheels carry them (site-packages/nvidia/*/lib).
libs=$(python3 - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "*", "lib"))})))
PY
)
# The driver's libcuda, where the image keeps it off the loader's path.
driver=$(ls -d /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH=${libs:+$libs:}${driver}${LD_LIBRARY_PATH:-}

section() { printf '\n## %s\n\n' "$*"; }
section "Machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -2
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($(nproc) cores)"
"$infgram" --version

for model in "$@"; do
    name=$(basename "$model")
    section "$name: a generation (GPU, then CPU)"
    timeout 60 "$infgram" gen --model "$model" --device cuda --prompt "The capital of France is" \
        --max-tokens 24 --json 2>&1 | tail -3
    timeout 60 "$infgram" gen --model "$model" --prompt "The capital of France is" \
        --max-tokens 24 --json 2>&1 | tail -3
    section "$name: the fused kernels against their CPU reference and the native pass; batch invariance (GPU)"
    timeout 150 "$bench" gpu-check --model "$model" 2>&1 | tail -26
    section "$name: a pass of k new tokens against a one-token step (GPU: fused kernels with and without CUDA graphs, then the candle pass)"
    timeout 60 "$bench" passes --model "$model" --device cuda --repeats 30 2>&1 | tail -8
    if [ -n "${INFGRAM_VARIANTS:-}" ]; then
        for variant in $INFGRAM_VARIANTS built-in; do
            echo "kernels: $variant"
            if [ "$variant" = built-in ]; then
                timeout 60 "$bench" passes --model "$model" --device cuda --repeats 30 2>&1 | tail -5
            else
                INFGRAM_CUDA_KERNELS=$variant timeout 60 "$bench" passes --model "$model" \
                    --device cuda --repeats 30 2>&1 | tail -5
            fi
        done
    fi
    INFGRAM_CUDA_GRAPHS=0 timeout 60 "$bench" passes --model "$model" --device cuda --repeats 30 2>&1 | tail -8
    timeout 90 "$bench" passes --model "$model" --device cuda --backend candle --repeats 30 2>&1 | tail -8
    # One prompt set a run, each with its own limit, so that a slow set leaves the others.
    for set in "copy 150" "Shakespeare 90" "open 150"; do
        read -r prefix limit <<<"$set"
        section "$name: speculative against plain decoding, $prefix prompts (GPU)"
        log=$(mktemp)
        timeout "$limit" "$bench" speculative --model "$model" --device cuda --set "$prefix" \
            2>"$log" | sed -n '1,/^Per prompt/p' | head -n -1
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "(did not finish in ${limit} s; last lines:)"; tail -3 "$log"; }
        rm -f "$log"
    done
    # Several clients at once on the GPU, their passes shared (every client's tokens checked
    # against the same prompt decoded alone: the "as alone" column).
    section "$name: several clients at once, their passes shared (GPU)"
    timeout 240 "$bench" batch --model "$model" --device cuda --clients 1,4,16 --max-tokens 96 \
        2>&1 | tail -8
    # A coder model (a file named *coder*): the code-edit set through its chat template,
    # speculative against plain decoding, on the GPU (the summary table).
    case "${name,,}" in
    *coder*)
        section "$name: code edits, speculative against plain decoding (GPU)"
        timeout 420 "$bench" edits --model "$model" --device cuda 2>&1 | tail -4
        ;;
    esac
    # The other decoders on the device, each against plain decoding (`identical`), and the
    # model's perplexity: a Shakespeare passage the prompts quote.
    section "$name: the other decoders and ppl on the GPU (speculative vs plain, greedy)"
    text=$(mktemp --suffix .txt)
    printf 'ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\nArise, fair sun, and kill the envious moon,\nWho is already sick and pale with grief,\n' >"$text"
    past=$(mktemp -u --suffix .past)
    spec=(gen --model "$model" --device cuda --temperature 0 --max-tokens 96 --json --compare
        --speculative --prompt "Repeat this passage exactly: $(cat "$text")")
    for variant in "trees --draft-trees" "mix --mix" "past-outputs(1) --past-outputs $past" \
        "past-outputs(2) --past-outputs $past" "guard --guard 8 --mix"; do
        read -r label flags <<<"$variant"
        # shellcheck disable=SC2086
        timeout 90 "$infgram" "${spec[@]}" $flags 2>&1 | tail -1 | python3 -c '
import json, sys
line = sys.stdin.read().strip()
try:
    r = json.loads(line)
    keys = ("identical", "tokens_per_second", "plain_tokens_per_second", "speedup")
    print("%-16s identical %s  %7.1f tok/s  plain %7.1f  speed-up %.2f" % ((sys.argv[1],) + tuple(r[k] for k in keys)))
except Exception:
    print("%-16s %s" % (sys.argv[1], line[-300:]))' "$label"
    done
    timeout 60 "$infgram" ppl --model "$model" --device cuda --text "$text" 2>&1 | sed -n "1p;\$p" | sed "s/^/GPU /"
    timeout 60 "$infgram" ppl --model "$model" --text "$text" 2>&1 | sed -n "1p;\$p" | sed "s/^/CPU /"
    rm -f "$text" "$past"
    # One model on the GPU serving the completions queue (127.0.0.1, one request, then stopped).
    "$infgram" serve --model "$model" --device cuda --addr 127.0.0.1:18089 --quiet &
    server=$!
    for _ in $(seq 60); do curl -sf 127.0.0.1:18089/health >/dev/null && break; sleep 1; done
    echo "serve --device cuda: $(curl -s -m 30 127.0.0.1:18089/v1/completions \
        -H 'content-type: application/json' \
        -d '{"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "mode": "speculative"}' \
        | head -c 300)"
    kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
    # llama.cpp's CUDA build on the same GPU and file (scripts/build-llama-bench.sh; its folder
    # as LLAMA_BENCH_DIR, default target/llama/dist): tg128 and pp16, from an empty context and
    # after 256 tokens, flash attention on and off.
    llama=${LLAMA_BENCH_DIR:-$here/target/llama/dist}
    if [ -x "$llama/llama-bench" ]; then
        section "$name: llama.cpp (llama-bench) on the same GPU"
        for fa in 1 0; do
            LD_LIBRARY_PATH=$llama:$LD_LIBRARY_PATH timeout 120 "$llama/llama-bench" -m "$model" \
                -ngl 99 -fa "$fa" -p 16 -n 128 -d 0,256 -r 5 -o md 2>&1 | grep '^|' | tail -4
        done
    fi
    section "$name: Hugging Face transformers on the same GPU"
    "$bench" prompts | timeout 180 python3 "$here/scripts/hf_baseline.py" "$model" \
        --per-set 2 --max-new-tokens 128 2>&1 | tail -8
done
