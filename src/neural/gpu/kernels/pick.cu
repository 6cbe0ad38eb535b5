// The greedy pick of each row of a pass's logits.
//
// Included by kernels.cu (one translation unit), in the order kernels.cu names.

// The greedy pick of rows of a pass's logits, so that greedy decoding copies back an id and a
// logit a row instead of the row (Gemma's 262,144 logits are 1 MB). The id is the one
// `lm::first_max` gives: the smallest index holding the largest logit above −∞ (NaN never
// counts; −0 and +0 are one value), or none (NO_PICK here, −1 in `pick`). Taking the larger
// value, the smaller index among equal values, is a total order on (value, index) pairs, so
// the answer does not depend on how the row is split. Two launches: `pick_part`, a block per
// GREEDY_CHUNK logits of a row (grid: chunks × rows), then `pick`, a warp per row over its
// chunks' pairs.
#define GREEDY_CHUNK 4096
#define NO_PICK 0x7fffffff

__device__ __forceinline__ void better(float &v, int &i, float w, int j) {
    if (w > v || (w == v && j < i)) {
        v = w;
        i = j;
    }
}

__device__ __forceinline__ void warp_better(float &v, int &i) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        float w = __shfl_xor_sync(0xffffffff, v, m);
        int j = __shfl_xor_sync(0xffffffff, i, m);
        better(v, i, w, j);
    }
}

// part[(row · chunks + chunk) · 2 …]: the chunk's best value's bits and its index.
extern "C" __global__ void pick_part(const float *logits, int vocab, int *part) {
    __shared__ float sv[32];
    __shared__ int si[32];
    int row = blockIdx.y, chunk = blockIdx.x, chunks = gridDim.x;
    const float *x = logits + (size_t)row * vocab;
    int end = min(vocab, (chunk + 1) * GREEDY_CHUNK);
    float v = -INFINITY;
    int i = NO_PICK;
    for (int e = chunk * GREEDY_CHUNK + threadIdx.x; e < end; e += blockDim.x) {
        float w = x[e];
        if (w > v) {  // ascending e: the first of a thread's equal maxima stays
            v = w;
            i = e;
        }
    }
    warp_better(v, i);
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = i;
    }
    __syncthreads();
    if (warp) return;
    v = lane < blockDim.x / WARP ? sv[lane] : -INFINITY;
    i = lane < blockDim.x / WARP ? si[lane] : NO_PICK;
    warp_better(v, i);
    if (lane == 0) {
        int *p = part + ((size_t)row * chunks + chunk) * 2;
        p[0] = __float_as_int(v);
        p[1] = i;
    }
}

// out[2 · row …]: the row's best value's bits and its index (−1: none above −∞). A warp per row.
extern "C" __global__ void pick(const int *part, int chunks, int *out) {
    int row = blockIdx.x, lane = threadIdx.x;
    float v = -INFINITY;
    int i = NO_PICK;
    for (int c = lane; c < chunks; c += WARP) {
        const int *p = part + ((size_t)row * chunks + c) * 2;
        better(v, i, __int_as_float(p[0]), p[1]);
    }
    warp_better(v, i);
    if (lane == 0) {
        out[2 * row] = __float_as_int(v);
        out[2 * row + 1] = i == NO_PICK ? -1 : i;
    }
}
