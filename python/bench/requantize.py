"""Re-quantize a GGUF file with llama.cpp's own quantizer (the SmolLM2 Q4_K_M file of the K-quant tests).

    python python/bench/requantize.py IN.gguf OUT.gguf [--ftype Q4_K_M]

needs `pip install llama-cpp-python==0.3.36` (built from its source; see llamacpp_oracle.py).
llama.cpp re-quantizes from the file's weights (`allow_requantize`), and picks each tensor's
type by its own rules: SmolLM2's 576-wide rows cannot hold Q4_K's 256-column super-blocks, so
most of its matrices fall back to Q5_0. Then

    cargo run --release --example bench_model -- --model OUT.gguf --against IN.gguf

times the two files side by side.
"""

import argparse
import ctypes

import llama_cpp

FTYPES = {
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "Q4_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--ftype", default="Q4_K_M", choices=sorted(FTYPES))
    args = ap.parse_args()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[args.ftype]
    params.allow_requantize = True
    status = llama_cpp.llama_model_quantize(
        args.input.encode(), args.output.encode(), ctypes.byref(params)
    )
    if status != 0:
        raise SystemExit(f"llama_model_quantize failed ({status})")
    print(args.output)


if __name__ == "__main__":
    main()
