// Shared by every kernel: the sizes, the GGML block types, a matrix as the kernels read it,
// exact float helpers, decoding 32 values of a block, warp sums and the copy of a pass's input
// rows into shared memory.
//
// Included by kernels.cu (one translation unit), in the order kernels.cu names.

#include <stdint.h>
#include <cuda_fp16.h>

#define WARP 32
// Rows of a pass one matrix-vector call takes at most (more: the grid's y dimension).
#define TOKENS 8

// The several-row matrix kernels' launch bounds: MANY_MIN_BLOCKS blocks of 256 threads a
// multiprocessor must hold at once, so ptxas caps their registers to fit (2: at most 128;
// measured on an H100, a 16-row SmolLM2 pass 2.12 ms against 2.31 uncapped, where gate/up
// held 162 registers and qkv 234, one block a multiprocessor). -DMANY_MIN_BLOCKS=1 lifts the
// cap (a variant to measure: INFGRAM_CUDA_KERNELS loads such a build).
#ifndef MANY_MIN_BLOCKS
#define MANY_MIN_BLOCKS 2
#endif
#define MANY_BOUNDS __launch_bounds__(256, MANY_MIN_BLOCKS)

// Loads a thread of a several-row kernel has in flight while copying its input (`load_input`).
#ifndef LOAD_BATCH
#define LOAD_BATCH 8
#endif

// GGML type ids.
#define Q4_0 2
#define Q4_1 3
#define Q5_0 6
#define Q5_1 7
#define Q8_0 8
#define Q4_K 12
#define Q5_K 13
#define Q6_K 14

struct Mat {
    const uint8_t *w;   // rows × row_bytes
    int type;
    int rows;
    int cols;
    int row_bytes;
};

// Up to three matrices that read the same input, one after another in the grid's rows (q, k, v).
struct Mats {
    Mat m[3];
    float *out[3];         // each t × m.rows
    const float *bias[3];  // m.rows, or null
    int n;
};

__device__ __forceinline__ float h2f(const uint8_t *p) {
    return __half2float(*reinterpret_cast<const __half *>(p));
}
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

__device__ __forceinline__ void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Values 32·g … 32·g + 31 of a row at `row`, read in 16- or 32-bit words (every block
// type's blocks are 2-byte aligned; Q4_1, Q5_1, Q4_K, Q5_K's 4-byte aligned).
// TY: the block type when known at compile time (the switch then folds to one case, so that a
// kernel's code path stays short and straight), or -1 to switch on `type` at run time.
template <int TY>
__device__ __forceinline__ void decode32(int type, const uint8_t *row, int g, float w[32]) {
    switch (TY < 0 ? type : TY) {
    case Q4_0: {
        const uint8_t *b = row + g * 18;
        float d = h2f(b);
        const uint16_t *q = (const uint16_t *)(b + 2);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint16_t v = q[k];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int j = 2 * k + i, byte = (v >> (8 * i)) & 255;
                w[j] = mul((float)((byte & 15) - 8), d);
                w[j + 16] = mul((float)((byte >> 4) - 8), d);
            }
        }
        break;
    }
    case Q4_1: {
        const uint8_t *b = row + g * 20;
        float d = h2f(b), m = h2f(b + 2);
        const uint32_t *q = (const uint32_t *)(b + 4);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t v = q[k];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int j = 4 * k + i, byte = (v >> (8 * i)) & 255;
                w[j] = add(mul((float)(byte & 15), d), m);
                w[j + 16] = add(mul((float)(byte >> 4), d), m);
            }
        }
        break;
    }
    case Q5_0: {
        const uint8_t *b = row + g * 22;
        float d = h2f(b);
        const uint16_t *h = (const uint16_t *)(b + 2);
        uint32_t qh = h[0] | ((uint32_t)h[1] << 16);
        const uint16_t *q = (const uint16_t *)(b + 6);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint16_t v = q[k];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int j = 2 * k + i, byte = (v >> (8 * i)) & 255;
                int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
                w[j] = mul((float)(((byte & 15) | h0) - 16), d);
                w[j + 16] = mul((float)(((byte >> 4) | h1) - 16), d);
            }
        }
        break;
    }
    case Q5_1: {
        const uint8_t *b = row + g * 24;
        float d = h2f(b), m = h2f(b + 2);
        uint32_t qh = *(const uint32_t *)(b + 4);
        const uint32_t *q = (const uint32_t *)(b + 8);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t v = q[k];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int j = 4 * k + i, byte = (v >> (8 * i)) & 255;
                int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
                w[j] = add(mul((float)((byte & 15) | h0), d), m);
                w[j + 16] = add(mul((float)((byte >> 4) | h1), d), m);
            }
        }
        break;
    }
    case Q8_0: {
        const uint8_t *b = row + g * 34;
        float d = h2f(b);
        const uint16_t *q = (const uint16_t *)(b + 2);
#pragma unroll
        for (int k = 0; k < 16; k++) {
            uint16_t v = q[k];
            w[2 * k] = mul((float)(int8_t)(v & 255), d);
            w[2 * k + 1] = mul((float)(int8_t)(v >> 8), d);
        }
        break;
    }
    case Q4_K: {
        // Sub-block s of a super-block of 256: pair s / 2 of 64 values, low nibbles if even.
        const uint8_t *b = row + (g / 8) * 144;
        int s = g % 8, sc, mn;
        float d = h2f(b), dmin = h2f(b + 2);
        scale_min_k4(s, b + 4, &sc, &mn);
        float d1 = mul(d, (float)sc), m1 = mul(dmin, (float)mn);
        const uint32_t *q = (const uint32_t *)(b + 16 + 32 * (s / 2));
        int shift = 4 * (s % 2);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t v = q[k] >> shift;
#pragma unroll
            for (int i = 0; i < 4; i++)
                w[4 * k + i] = sub(mul(d1, (float)((v >> (8 * i)) & 15)), m1);
        }
        break;
    }
    case Q5_K: {
        const uint8_t *b = row + (g / 8) * 176;
        int s = g % 8, sc, mn;
        float d = h2f(b), dmin = h2f(b + 2);
        scale_min_k4(s, b + 4, &sc, &mn);
        float d1 = mul(d, (float)sc), m1 = mul(dmin, (float)mn);
        const uint32_t *qh = (const uint32_t *)(b + 16), *ql = (const uint32_t *)(b + 48 + 32 * (s / 2));
        int shift = 4 * (s % 2);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            uint32_t lo = ql[k] >> shift, hi = qh[k] >> s;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float h = ((hi >> (8 * i)) & 1) ? 16.f : 0.f;
                w[4 * k + i] = sub(mul(d1, add((float)((lo >> (8 * i)) & 15), h)), m1);
            }
        }
        break;
    }
    case Q6_K: {
        // Sub-block s: half s / 4 of 128 values, part s % 4 of it.
        const uint8_t *b = row + (g / 8) * 210;
        int s = g % 8, half = s / 4, part = s % 4;
        const uint16_t *lo = (const uint16_t *)(b + 64 * half + 32 * (part % 2));
        const uint16_t *qh = (const uint16_t *)(b + 128 + 32 * half);
        uint16_t scs = *(const uint16_t *)(b + 192 + 8 * half + 2 * part);
        float d = h2f(b + 208);
        float d0 = mul(d, (float)(int8_t)(scs & 255)), d1 = mul(d, (float)(int8_t)(scs >> 8));
        int lshift = 4 * (part / 2), hshift = 2 * part;
#pragma unroll
        for (int k = 0; k < 16; k++) {
            uint16_t l = lo[k], h = qh[k];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int j = 2 * k + i;
                int q = (((l >> (8 * i + lshift)) & 15) | (((h >> (8 * i + hshift)) & 3) << 4)) - 32;
                w[j] = mul(j < 16 ? d0 : d1, (float)q);
            }
        }
        break;
    }
    default:
        for (int j = 0; j < 32; j++) w[j] = __int_as_float(0x7fc00000);
    }
}

// A pass's parameters in device memory (so a captured graph replays any pass of its row count),
// T the most rows a pass takes: params[0] = the pass's rows; for row i, params[1 + i] = its
// token, params[1 + T + i] = its position in its sequence, params[1 + 2T + i] = the positions its
// sequence held before the pass, params[1 + 3T + i] = the slot of its sequence's position 0,
// params[1 + 4T + i] = the slot it is written at, params[1 + 5T + i·T + d] = the slot of the
// node at depth d of its branch (`gpu::params_of`). Rows of several sequences share a pass:
// each row reads only its own sequence's slots.
__device__ __forceinline__ int row_token(const int *params, int row) { return params[1 + row]; }
__device__ __forceinline__ int row_position(const int *params, int T, int row) { return params[1 + T + row]; }
__device__ __forceinline__ int row_cached(const int *params, int T, int row) { return params[1 + 2 * T + row]; }
__device__ __forceinline__ int row_base(const int *params, int T, int row) { return params[1 + 3 * T + row]; }
__device__ __forceinline__ int row_slot(const int *params, int T, int row) { return params[1 + 4 * T + row]; }
__device__ __forceinline__ const int *row_branch(const int *params, int T, int row) { return params + 1 + 5 * T + row * T; }

// A warp's sum of one value per lane: a butterfly, which leaves the same bits in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = add(v, __shfl_xor_sync(0xffffffff, v, m));
    return v;
}

// 1 / sqrt(mean square + eps) of `x[0..n]`, in every lane (lane l sums l, l + 32, …).
__device__ __forceinline__ float warp_inv_rms(const float *x, int n, float eps, int lane) {
    float ss = 0.f;
    // Unrolled: the loads run ahead of the chain (whose order stays e ascending).
#pragma unroll 8
    for (int e = lane; e < n; e += WARP) ss = fmaf(x[e], x[e], ss);
    ss = warp_sum(ss);
    return 1.f / sqrtf(add(ss / (float)n, eps));
}

// A block's copy of the rows of input it multiplies, in shared memory: row n's element e at
// n · padded(cols) + padded(e), four floats of padding after every 32, so that the lanes of a
// warp, each reading its own group of 32 as 16-byte vectors, hit distinct banks.
__device__ __forceinline__ int padded(int e) { return e + (e >> 5) * 4; }

// Copies `ntok` rows of `cols` from x (row stride `stride`) into xs, RMS-normed with `norm`
// when given (warp n forms row n's 1 / rms with the lanes' butterfly, then every element is
// x · inv · w), and zeros rows ntok … TK − 1. Every thread of the block takes part; ends with
// the block synchronized. The kernel's input is never its output, so it is read through the
// read-only path; a thread of a several-row kernel issues LOAD_BATCH loads before it stores
// any (a store to shared memory may not pass a load the compiler cannot tell apart from it:
// one at a time, each copy waited for its load, twelve in a row for a 1,536-wide 8-row input).
template <int TK>
__device__ __forceinline__ void load_input(float *xs, const float *x, int stride, int cols, int ntok,
                                           const float *norm, float eps) {
    __shared__ float inv[TK];
    constexpr int U = TK > 1 ? LOAD_BATCH : 1;
    int pc = padded(cols), quads = ntok * cols / 4;
    for (int i0 = threadIdx.x; i0 < quads; i0 += U * blockDim.x) {
        float4 r[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = i0 + u * blockDim.x, n = (4 * i) / cols, e = (4 * i) % cols;
            if (i < quads) r[u] = __ldg(reinterpret_cast<const float4 *>(x + (size_t)n * stride + e));
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = i0 + u * blockDim.x, n = (4 * i) / cols, e = (4 * i) % cols;
            if (i < quads) *reinterpret_cast<float4 *>(xs + n * pc + padded(e)) = r[u];
        }
    }
    // Rows past the pass's are zeros: the products run all TK rows' chains (none written).
    for (int i = threadIdx.x; TK > 1 && i < (TK - ntok) * cols / 4; i += blockDim.x) {
        int n = ntok + (4 * i) / cols, e = (4 * i) % cols;
        *reinterpret_cast<float4 *>(xs + n * pc + padded(e)) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    __syncthreads();
    if (!norm) return;
    int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int n = warp; n < ntok; n += blockDim.x / WARP) {
        float ss = 0.f;
#pragma unroll 8
        for (int e = lane; e < cols; e += WARP) {
            float v = xs[n * pc + padded(e)];
            ss = fmaf(v, v, ss);
        }
        ss = warp_sum(ss);
        if (lane == 0) inv[n] = 1.f / sqrtf(add(ss / (float)cols, eps));
    }
    __syncthreads();
    for (int i0 = threadIdx.x; i0 < ntok * cols; i0 += U * blockDim.x) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = i0 + u * blockDim.x, n = i / cols, e = i % cols;
            if (i < ntok * cols) v[u] = mul(mul(xs[n * pc + padded(e)], inv[n]), __ldg(norm + e));
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int i = i0 + u * blockDim.x, n = i / cols, e = i % cols;
            if (i < ntok * cols) xs[n * pc + padded(e)] = v[u];
        }
    }
    __syncthreads();
}

// Row `lane` of a warp's TK sums (every lane holds all TK, the same bits: the butterfly's), so
// that lane n writes row n's output: a residual's read-modify-writes go out together instead of
// one lane's eight each waiting for its load.
template <int TK>
__device__ __forceinline__ float lane_row(const float v[TK], int lane) {
    float r = v[0];
#pragma unroll
    for (int n = 1; n < TK; n++)
        if (lane == n) r = v[n];
    return r;
}
