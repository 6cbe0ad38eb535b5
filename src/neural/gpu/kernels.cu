// infgram's GPU step: the kernels of one decoder pass, fused and batch-invariant.
//
// Every kernel gives a row (a token of a pass) the same arithmetic in the same order whatever
// else the pass holds: work is split over lanes and threads by the row's own sizes (the model's
// widths, the positions the row sees), never by the pass's row count, and every reduction runs a
// fixed tree. So the rows of a k-token pass, or of a token tree, are the bits of k one-token
// passes. Rounding is spelled out (__fmul_rn, __fadd_rn: no contraction into fused multiply-adds
// except where a fmaf is written), so that `reference.rs`, which follows the same order on the
// CPU, gives the same bits everywhere but in expf.
//
// Weights stay in GGUF's blocks; `decode32` turns 32 values of a row into floats with the
// arithmetic of candle's (ggml's) dequantization, operation for operation.
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

// Row r of matrix m times the TK input rows in xs: lane l takes groups l, l + 32, …, each a
// fixed chain of 32 fused multiply-adds, then the warp's butterfly. Every one of the TK rows'
// chains runs (rows past the pass's are zeros, their sums unused): unguarded, the compiler
// interleaves the TK independent chains and issues the shared loads ahead of them, where a
// guarded row was a branch of its own whose chain waited on each multiply-add and load.
template <int TK, int TY>
__device__ __forceinline__ void row_dot(const Mat &m, int r, const float *xs, int lane,
                                        float acc[TK]) {
#pragma unroll
    for (int n = 0; n < TK; n++) acc[n] = 0.f;
    const uint8_t *row = m.w + (size_t)r * m.row_bytes;
    int groups = m.cols / 32, pc = padded(m.cols);
    for (int g = lane; g < groups; g += WARP) {
        float w[32];
        decode32<TY>(m.type, row, g, w);
        if (TK == 1) {  // the one-row loop of stop 61, kept as version 8 was measured with it
            const float4 *xv = reinterpret_cast<const float4 *>(xs + g * 36);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float4 v = xv[j];
                acc[0] = fmaf(w[4 * j], v.x, acc[0]);
                acc[0] = fmaf(w[4 * j + 1], v.y, acc[0]);
                acc[0] = fmaf(w[4 * j + 2], v.z, acc[0]);
                acc[0] = fmaf(w[4 * j + 3], v.w, acc[0]);
            }
            continue;
        }
        const float4 *xv = reinterpret_cast<const float4 *>(xs + g * 36);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float4 v[TK];
#pragma unroll
            for (int n = 0; n < TK; n++) v[n] = xv[n * (pc / 4) + j];
#pragma unroll
            for (int n = 0; n < TK; n++) acc[n] = fmaf(w[4 * j], v[n].x, acc[n]);
#pragma unroll
            for (int n = 0; n < TK; n++) acc[n] = fmaf(w[4 * j + 1], v[n].y, acc[n]);
#pragma unroll
            for (int n = 0; n < TK; n++) acc[n] = fmaf(w[4 * j + 2], v[n].z, acc[n]);
#pragma unroll
            for (int n = 0; n < TK; n++) acc[n] = fmaf(w[4 * j + 3], v[n].w, acc[n]);
        }
    }
#pragma unroll
    for (int n = 0; n < TK; n++) acc[n] = warp_sum(acc[n]);
}

// Row ra of a and row rb of b (of one width: gate and up, or a rotation's two rows) times the
// input rows, as two `row_dot`s whose weights are both decoded before either's multiply-adds
// (the loads overlap).
template <int TK, int TA, int TB>
__device__ __forceinline__ void row_dot2(const Mat &a, int ra, const Mat &b, int rb,
                                         const float *xs, int lane,
                                         float acc_a[TK], float acc_b[TK]) {
#pragma unroll
    for (int n = 0; n < TK; n++) acc_a[n] = acc_b[n] = 0.f;
    const uint8_t *row_a = a.w + (size_t)ra * a.row_bytes, *row_b = b.w + (size_t)rb * b.row_bytes;
    int groups = a.cols / 32, pc = padded(a.cols);
    for (int g = lane; g < groups; g += WARP) {
        float wa[32], wb[32];
        decode32<TA>(a.type, row_a, g, wa);
        decode32<TB>(b.type, row_b, g, wb);
        if (TK == 1) {  // the one-row loop of stop 61, kept as version 8 was measured with it
            const float4 *xv = reinterpret_cast<const float4 *>(xs + g * 36);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float4 v = xv[j];
                acc_a[0] = fmaf(wa[4 * j], v.x, acc_a[0]);
                acc_a[0] = fmaf(wa[4 * j + 1], v.y, acc_a[0]);
                acc_a[0] = fmaf(wa[4 * j + 2], v.z, acc_a[0]);
                acc_a[0] = fmaf(wa[4 * j + 3], v.w, acc_a[0]);
                acc_b[0] = fmaf(wb[4 * j], v.x, acc_b[0]);
                acc_b[0] = fmaf(wb[4 * j + 1], v.y, acc_b[0]);
                acc_b[0] = fmaf(wb[4 * j + 2], v.z, acc_b[0]);
                acc_b[0] = fmaf(wb[4 * j + 3], v.w, acc_b[0]);
            }
            continue;
        }
        const float4 *xv = reinterpret_cast<const float4 *>(xs + g * 36);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float4 v[TK];
#pragma unroll
            for (int n = 0; n < TK; n++) v[n] = xv[n * (pc / 4) + j];
#pragma unroll
            for (int n = 0; n < TK; n++) {
                acc_a[n] = fmaf(wa[4 * j], v[n].x, acc_a[n]);
                acc_b[n] = fmaf(wb[4 * j], v[n].x, acc_b[n]);
            }
#pragma unroll
            for (int n = 0; n < TK; n++) {
                acc_a[n] = fmaf(wa[4 * j + 1], v[n].y, acc_a[n]);
                acc_b[n] = fmaf(wb[4 * j + 1], v[n].y, acc_b[n]);
            }
#pragma unroll
            for (int n = 0; n < TK; n++) {
                acc_a[n] = fmaf(wa[4 * j + 2], v[n].z, acc_a[n]);
                acc_b[n] = fmaf(wb[4 * j + 2], v[n].z, acc_b[n]);
            }
#pragma unroll
            for (int n = 0; n < TK; n++) {
                acc_a[n] = fmaf(wa[4 * j + 3], v[n].w, acc_a[n]);
                acc_b[n] = fmaf(wb[4 * j + 3], v[n].w, acc_b[n]);
            }
        }
    }
#pragma unroll
    for (int n = 0; n < TK; n++) {
        acc_a[n] = warp_sum(acc_a[n]);
        acc_b[n] = warp_sum(acc_b[n]);
    }
}

// Asks for a matrix row's bytes ahead of their use (lane l: the row's 128-byte lines l,
// l + 32, …), so that fetching them overlaps other work.
__device__ __forceinline__ void prefetch_row(const Mat &m, int r, int lane) {
    const uint8_t *row = m.w + (size_t)r * m.row_bytes;
    for (int off = lane * 128; off < m.row_bytes; off += WARP * 128)
        asm volatile("prefetch.global.L1 [%0];" ::"l"(row + off));
}

// Row r of 1 to 3 matrices one after another: the matrix it falls in, and r within it.
struct Pick {
    Mat m;
    float *out;
    const float *bias;
    int r;
};

// Picked without indexing the parameter arrays at run time (which copies them to local
// memory).
__device__ __forceinline__ Pick pick(const Mats &mats, int r) {
    Pick p = {mats.m[0], mats.out[0], mats.bias[0], r};
    if (p.r >= p.m.rows && mats.n > 1) {
        p.r -= p.m.rows;
        p = {mats.m[1], mats.out[1], mats.bias[1], p.r};
        if (p.r >= p.m.rows && mats.n > 2) {
            p.r -= p.m.rows;
            p = {mats.m[2], mats.out[2], mats.bias[2], p.r};
        }
    }
    return p;
}

// Calls F<TK, type>(args…) with `ty` as a compile-time block type (-1, for a type no case
// names or matrices of mixed types: `decode32` switches at run time): a launch then runs one
// type's short, straight path.
#define BY_TYPE(ty, F, ...)                                                                    \
    switch (ty) {                                                                              \
    case Q4_0: F<TK, Q4_0>(__VA_ARGS__); break;                                                \
    case Q4_1: F<TK, Q4_1>(__VA_ARGS__); break;                                                \
    case Q5_0: F<TK, Q5_0>(__VA_ARGS__); break;                                                \
    case Q5_1: F<TK, Q5_1>(__VA_ARGS__); break;                                                \
    case Q8_0: F<TK, Q8_0>(__VA_ARGS__); break;                                                \
    case Q4_K: F<TK, Q4_K>(__VA_ARGS__); break;                                                \
    case Q5_K: F<TK, Q5_K>(__VA_ARGS__); break;                                                \
    case Q6_K: F<TK, Q6_K>(__VA_ARGS__); break;                                                \
    default: F<TK, -1>(__VA_ARGS__);                                                           \
    }

// The block type all of `mats` share, or -1.
__device__ __forceinline__ int shared_type(const Mats &mats) {
    return mats.n == 1 || (mats.m[1].type == mats.m[0].type &&
                           (mats.n == 2 || mats.m[2].type == mats.m[0].type))
               ? mats.m[0].type
               : -1;
}

// out = W · in (+ bias) (+ residual: out[r] += …, in place), for 1 to 3 matrices reading the same
// input (all `cols` wide). blockIdx.y picks TK rows of the pass, copied (and normed with
// `norm`) into shared memory once per block; the block's warps then take rows blockIdx.x · 8 +
// warp, stepping by the grid's warps (the grid is capped at what the GPU holds at once: every
// block pays for its copy of the input once). A warp asks for its next row's bytes before it
// works on the current one. Dynamic shared memory: TK · padded(cols) floats.
template <int TK, int TY>
__device__ __forceinline__ void matvec_typed(Mats mats, const float *x, int stride, int t, const float *norm,
                                  float eps, int residual) {
    extern __shared__ float xs[];
    int lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
    int first = blockIdx.y * TK;
    int ntok = min(TK, t - first);
    int total = mats.m[0].rows + (mats.n > 1 ? mats.m[1].rows : 0) + (mats.n > 2 ? mats.m[2].rows : 0);
    int step = gridDim.x * warps, r = blockIdx.x * warps + threadIdx.x / WARP;
    if (r < total) {
        Pick p = pick(mats, r);
        prefetch_row(p.m, p.r, lane);
    }
    load_input<TK>(xs, x + (size_t)first * stride, stride, mats.m[0].cols, ntok, norm, eps);
    for (; r < total; r += step) {
        Pick p = pick(mats, r);
        if (r + step < total) {
            Pick next = pick(mats, r + step);
            prefetch_row(next.m, next.r, lane);
        }
        float acc[TK];
        row_dot<TK, TY>(p.m, p.r, xs, lane, acc);
        if (lane < ntok) {
            float v = lane_row<TK>(acc, lane);
            if (p.bias) v = add(v, p.bias[p.r]);
            float *o = p.out + (size_t)(first + lane) * p.m.rows + p.r;
            *o = residual ? add(*o, v) : v;
        }
    }
}
template <int TK>
__device__ __forceinline__ void matvec_rows(Mats mats, const float *x, int stride, int t, const float *norm,
                                  float eps, int residual) {
    BY_TYPE(shared_type(mats), matvec_typed, mats, x, stride, t, norm, eps, residual)
}

// q, k, v of models without per-head norms in one kernel: `matvec` over the three matrices
// (the RMS norm before them fused in), with the rotation and the cache write of `rope_cache`
// on the way out. A warp takes a rotation's two rows together (q or k: head h, pair i), or one
// value row; every row's arithmetic is `row_dot`'s and the rotation's that of `rope_cache`, so
// the bits are those of the two kernels it replaces. q is written rotated to `q`; k and v go to
// the cache at slot pos + row. Grid and shared memory as `matvec`.
template <int TK, int TY>
__device__ __forceinline__ void qkv_rope_typed(Mats mats, const float *x, int stride, int t, const float *norm,
                                    float eps, const int *params, int T, int nh, int nkv, int hd,
                                    const float *cos_t, const float *sin_t, int interleaved,
                                    float *q, float *kcache, float *vcache, int capacity) {
    extern __shared__ float xs[];
    int lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
    int first = blockIdx.y * TK;
    int ntok = min(TK, t - first);
    int half = hd / 2, rotated = (nh + nkv) * half, total = rotated + nkv * hd;
    int step = gridDim.x * warps, u0 = blockIdx.x * warps + threadIdx.x / WARP;
    // The first unit's rows are asked for before the input is copied in (as `matvec`).
    if (u0 < total) {
        if (u0 >= rotated) {
            prefetch_row(mats.m[2], u0 - rotated, lane);
        } else {
            bool is_q = u0 < nh * half;
            int hu = is_q ? u0 : u0 - nh * half, h = hu / half, i = hu % half;
            Mat m = mats.m[1];
            if (is_q) m = mats.m[0];
            prefetch_row(m, h * hd + (interleaved ? 2 * i : i), lane);
            prefetch_row(m, h * hd + (interleaved ? 2 * i + 1 : i + half), lane);
        }
    }
    load_input<TK>(xs, x + (size_t)first * stride, stride, mats.m[0].cols, ntok, norm, eps);
    int pos = params[0];
    for (int u = u0; u < total; u += step) {
        float acc_a[TK], acc_b[TK];
        if (u >= rotated) {  // a value row, to the cache as it is
            int r = u - rotated, kh = r / hd, e = r % hd;
            row_dot<TK, TY>(mats.m[2], r, xs, lane, acc_a);
            if (lane < ntok) {
                float v = lane_row<TK>(acc_a, lane);
                if (mats.bias[2]) v = add(v, mats.bias[2][r]);
                vcache[((size_t)kh * capacity + pos + first + lane) * hd + e] = v;
            }
            continue;
        }
        bool is_q = u < nh * half;
        int hu = is_q ? u : u - nh * half, h = hu / half, i = hu % half;
        int a_i = interleaved ? 2 * i : i, b_i = interleaved ? 2 * i + 1 : i + half;
        Mat m = mats.m[1];
        const float *bias = mats.bias[1];
        if (is_q) {
            m = mats.m[0];
            bias = mats.bias[0];
        }
        int ra = h * hd + a_i, rb = h * hd + b_i;
        // The rows' angles, read before the products so that their loads overlap them.
        float c[TK], sn[TK];
#pragma unroll
        for (int n = 0; n < TK; n++) {
            int p = params[1 + T + first + min(n, ntok - 1)];
            c[n] = cos_t[(size_t)p * half + i];
            sn[n] = sin_t[(size_t)p * half + i];
        }
        row_dot2<TK, TY, TY>(m, ra, m, rb, xs, lane, acc_a, acc_b);
        if (lane < ntok) {
            float a = lane_row<TK>(acc_a, lane), b = lane_row<TK>(acc_b, lane);
            float cn = lane_row<TK>(c, lane), sn_n = lane_row<TK>(sn, lane);
            if (bias) {
                a = add(a, bias[ra]);
                b = add(b, bias[rb]);
            }
            int row = first + lane;
            float *dst = is_q ? q + (size_t)row * nh * hd + h * hd
                              : kcache + ((size_t)h * capacity + pos + row) * hd;
            dst[a_i] = sub(mul(a, cn), mul(b, sn_n));
            dst[b_i] = add(mul(a, sn_n), mul(b, cn));
        }
    }
}
template <int TK>
__device__ __forceinline__ void qkv_rope_rows(Mats mats, const float *x, int stride, int t, const float *norm,
                                    float eps, const int *params, int T, int nh, int nkv, int hd,
                                    const float *cos_t, const float *sin_t, int interleaved,
                                    float *q, float *kcache, float *vcache, int capacity) {
    BY_TYPE(shared_type(mats), qkv_rope_typed, mats, x, stride, t, norm, eps, params, T, nh, nkv, hd, cos_t, sin_t, interleaved, q, kcache, vcache, capacity)
}

// out = act(gate · in) · (up · in): the two products of the feed-forward block in one warp per
// row, the gate applied on the way out. act: 0 SiLU, 1 GELU (tanh), as g / (1 + e^(−arg)).
// Rows, grid and shared memory as `matvec`.
template <int TK, int TY>
__device__ __forceinline__ void gated_typed(Mat gate, Mat up, const float *x, int stride, int t,
                                 const float *norm, float eps, int act, float *out) {
    extern __shared__ float xs[];
    int lane = threadIdx.x % WARP, warps = blockDim.x / WARP;
    int first = blockIdx.y * TK;
    int ntok = min(TK, t - first);
    int step = gridDim.x * warps, r = blockIdx.x * warps + threadIdx.x / WARP;
    if (r < gate.rows) {
        prefetch_row(gate, r, lane);
        prefetch_row(up, r, lane);
    }
    load_input<TK>(xs, x + (size_t)first * stride, stride, gate.cols, ntok, norm, eps);
    for (; r < gate.rows; r += step) {
        if (r + step < gate.rows) {
            prefetch_row(gate, r + step, lane);
            prefetch_row(up, r + step, lane);
        }
        float g[TK], u[TK];
        row_dot2<TK, TY, TY>(gate, r, up, r, xs, lane, g, u);
        if (lane < ntok) {
            float gn = lane_row<TK>(g, lane), a = gn;
            if (act == 1) a = mul(a, add(1.5957692f, mul(mul(1.5957692f, 0.044715f), mul(a, a))));
            float y = mul(gn / add(1.f, expf(-a)), lane_row<TK>(u, lane));
            out[(size_t)(first + lane) * gate.rows + r] = y;
        }
    }
}
template <int TK>
__device__ __forceinline__ void gated_rows(Mat gate, Mat up, const float *x, int stride, int t,
                                 const float *norm, float eps, int act, float *out) {
    BY_TYPE(gate.type == up.type ? gate.type : -1, gated_typed, gate, up, x, stride, t, norm, eps, act, out)
}

// The entry points of the three matrix kernels for TK rows of a pass a block: `matvec`,
// `qkv_rope` and `gated` for TOKENS, then `…4`, `…2` and the one-row `…1` (the decoder takes
// the smallest that holds a pass of up to TOKENS rows: a block runs every one of its TK rows'
// chains).
#define PRODUCTS(SUFFIX, TK, BOUNDS)                                                            \
    extern "C" __global__ void BOUNDS matvec##SUFFIX(Mats mats, const float *x, int stride,     \
                                                     int t, const float *norm, float eps,       \
                                                     int residual) {                            \
        matvec_rows<TK>(mats, x, stride, t, norm, eps, residual);                               \
    }                                                                                           \
    extern "C" __global__ void BOUNDS qkv_rope##SUFFIX(                                         \
        Mats mats, const float *x, int stride, int t, const float *norm, float eps,             \
        const int *params, int T, int nh, int nkv, int hd, const float *cos_t,                  \
        const float *sin_t, int interleaved, float *q, float *kcache, float *vcache,            \
        int capacity) {                                                                         \
        qkv_rope_rows<TK>(mats, x, stride, t, norm, eps, params, T, nh, nkv, hd, cos_t, sin_t,  \
                          interleaved, q, kcache, vcache, capacity);                            \
    }                                                                                           \
    extern "C" __global__ void BOUNDS gated##SUFFIX(Mat gate, Mat up, const float *x,           \
                                                    int stride, int t, const float *norm,       \
                                                    float eps, int act, float *out) {           \
        gated_rows<TK>(gate, up, x, stride, t, norm, eps, act, out);                            \
    }
PRODUCTS(, TOKENS, MANY_BOUNDS)
PRODUCTS(4, 4, MANY_BOUNDS)
PRODUCTS(2, 2, MANY_BOUNDS)
PRODUCTS(1, 1, )

// x[row] = dequantized embedding of tokens[row] (· scale, when scale ≠ 0).
extern "C" __global__ void embed(Mat table, const int *params, float scale, float *x) {
    int row = blockIdx.x;
    int token = params[1 + row];
    const uint8_t *w = table.w + (size_t)token * table.row_bytes;
    for (int g = threadIdx.x; g < table.cols / 32; g += blockDim.x) {
        float v[32];
        decode32<-1>(table.type, w, g, v);
        for (int j = 0; j < 32; j++) {
            float y = v[j];
            x[(size_t)row * table.cols + g * 32 + j] = scale != 0.f ? mul(y, scale) : y;
        }
    }
}

// x[row] += rms_norm(y[row]) · w (Gemma's norms after the blocks). One warp per row. The
// pointers do not alias, so the update's loads go out eight at a time instead of each waiting
// for the last store (ncu, Gemma's one-row step: 12.8 µs a launch, two a layer).
extern "C" __global__ void norm_add(float *__restrict__ x, const float *__restrict__ y,
                                    const float *__restrict__ w, int dim, float eps) {
    int row = blockIdx.x, lane = threadIdx.x;
    const float *yr = y + (size_t)row * dim;
    float *xr = x + (size_t)row * dim;
    float inv = warp_inv_rms(yr, dim, eps, lane);
#pragma unroll 8
    for (int e = lane; e < dim; e += WARP) xr[e] = add(xr[e], mul(mul(yr[e], inv), w[e]));
}

// The pass's parameters in device memory (so a captured graph replays any pass of its row
// count): params[0] = cached positions before the pass (pos); params[1 + i] = token of row i;
// params[1 + T + i] = position of row i; params[1 + 2T + i·T + d] = the cache slot of the node at
// depth d of row i's branch (d ≤ its depth). T is the most rows a pass takes.

// Per row: q/k normed per head (when qnorm), rotated by the row's position, q kept in place and
// k, v written to the cache at slot pos + row. Block per row, a warp per head.
extern "C" __global__ void rope_cache(float *q, const float *k, const float *v, const int *params,
                                      int T, int nh, int nkv, int hd, const float *qnorm,
                                      const float *knorm, float eps, const float *cos_t,
                                      const float *sin_t, int interleaved, float *kcache,
                                      float *vcache, int capacity) {
    int row = blockIdx.x, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int warps = blockDim.x / WARP, half = hd / 2;
    int p = params[1 + T + row], slot = params[0] + row;
    const float *c = cos_t + (size_t)p * half, *s = sin_t + (size_t)p * half;
    for (int h = warp; h < nh + 2 * nkv; h += warps) {
        if (h >= nh + nkv) {  // a value head: to the cache as it is
            int kh = h - nh - nkv;
            const float *src = v + (size_t)row * nkv * hd + kh * hd;
            float *dst = vcache + ((size_t)kh * capacity + slot) * hd;
            for (int e = lane; e < hd; e += WARP) dst[e] = src[e];
            continue;
        }
        bool is_q = h < nh;
        int kh = h - nh;
        const float *src = is_q ? q + (size_t)row * nh * hd + h * hd : k + (size_t)row * nkv * hd + kh * hd;
        float *dst = is_q ? q + (size_t)row * nh * hd + h * hd : kcache + ((size_t)kh * capacity + slot) * hd;
        const float *nw = is_q ? qnorm : knorm;
        float inv = nw ? warp_inv_rms(src, hd, eps, lane) : 0.f;
        // Each lane reads its pairs before writing them (dst may be src).
        for (int i = lane; i < half; i += WARP) {
            int a_i = interleaved ? 2 * i : i, b_i = interleaved ? 2 * i + 1 : i + half;
            float a = src[a_i], b = src[b_i];
            if (nw) {
                a = mul(mul(a, inv), nw[a_i]);
                b = mul(mul(b, inv), nw[b_i]);
            }
            dst[a_i] = sub(mul(a, c[i]), mul(b, s[i]));
            dst[b_i] = add(mul(a, s[i]), mul(b, c[i]));
        }
    }
}

// Attention: the positions a row sees (its position + 1 of them, less those before a window)
// are cut into chunks of CHUNK from the first, and chunk c of (head, row) is taken by block
// (head, row, c mod gridDim.z), so that a one-token step spreads over many multiprocessors.
// Within a chunk, warp w takes positions start + w, start + w + 8, …: a position's score is the
// lanes' chains of fmaf over their dimensions (lane l: l, l + 32, …), the warp's butterfly, ·
// scale. The chunk's max m_c; its weights p = e^(score − m_c); warp w's sum of its p in order and
// its lanes' chains p · v over its positions; the chunk's sum s_c and vector o_c add the 8 warps
// in warp order. The last block of (head, row) to finish (a counter) combines the chunks in
// chunk order: M = max m_c, S = Σ s_c · e^(m_c − M), out = Σ o_c · e^(m_c − M) / S. No order
// depends on the pass's other rows, nor on gridDim.z (which block takes a chunk changes
// nothing of its arithmetic). Positions before the pass's are slot j = position j; the row's
// branch has its slots in the parameters.
#define CHUNK 32
#define ATT_WARPS 8
#define ATT_THREADS (ATT_WARPS * WARP)
#define PER_WARP (CHUNK / ATT_WARPS)
// Chunks a (row, head) has at most: the partials' stride.
#define MAX_CHUNKS (8192 / CHUNK)

// DIMS = head width / 32: each lane's dimensions. `part`: per (row, head) MAX_CHUNKS partials of
// head width + 2 floats (m_c, s_c, o_c); `count`: per (row, head), zero between launches.
template <int DIMS>
__device__ __forceinline__ void attend(const float *q, const float *kcache, const float *vcache,
                                       const int *params, int T, int nh, int nkv, int capacity,
                                       int window, float scale, float *out, float *part,
                                       int *count) {
    const int hd = DIMS * WARP;
    __shared__ float wmax[ATT_WARPS], wsum[ATT_WARPS];
    __shared__ float wout[ATT_WARPS][DIMS * WARP];
    __shared__ int last;
    int h = blockIdx.x, row = blockIdx.y;
    int tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    int kh = h / (nh / nkv);
    int pos = params[0];
    int n = params[1 + T + row] + 1;
    int first = window > 0 ? max(0, n - window) : 0;
    int chunks = (n - first + CHUNK - 1) / CHUNK;
    if ((int)blockIdx.z >= chunks) return;
    const int *branch = params + 1 + 2 * T + row * T;
    const float *K = kcache + (size_t)kh * capacity * hd, *V = vcache + (size_t)kh * capacity * hd;
    size_t rh = (size_t)row * nh + h;
    float *mine = part + rh * MAX_CHUNKS * (hd + 2);
    float qv[DIMS];
#pragma unroll
    for (int i = 0; i < DIMS; i++) qv[i] = q[rh * hd + lane + 32 * i];
    for (int c = blockIdx.z; c < chunks; c += gridDim.z) {
        int start = first + c * CHUNK;
        // Positions past the row's are read at the chunk's first slot and left out of the
        // arithmetic: no load waits behind a branch, so a warp's PER_WARP go out together.
        int slot[PER_WARP];
        bool valid[PER_WARP];
        int start_slot = start < pos ? start : branch[start - pos];
#pragma unroll
        for (int u = 0; u < PER_WARP; u++) {
            int j = start + warp + ATT_WARPS * u;
            valid[u] = j < n;
            slot[u] = !valid[u] ? start_slot : j < pos ? j : branch[j - pos];
        }
        float sc[PER_WARP], mx = -INFINITY;
#pragma unroll
        for (int u = 0; u < PER_WARP; u++) {
            const float *kj = K + (size_t)slot[u] * hd + lane;
            float d = 0.f;
#pragma unroll
            for (int i = 0; i < DIMS; i++) d = fmaf(qv[i], kj[32 * i], d);
            float dot = mul(warp_sum(d), scale);
            sc[u] = valid[u] ? dot : -INFINITY;
            mx = fmaxf(mx, sc[u]);
        }
        if (lane == 0) wmax[warp] = mx;
        __syncthreads();
        float m = wmax[0];
#pragma unroll
        for (int w = 1; w < ATT_WARPS; w++) m = fmaxf(m, wmax[w]);
        float sum = 0.f, acc[DIMS];
#pragma unroll
        for (int i = 0; i < DIMS; i++) acc[i] = 0.f;
#pragma unroll
        for (int u = 0; u < PER_WARP; u++) {
            const float *vj = V + (size_t)slot[u] * hd + lane;
            float p = expf(sub(sc[u], m));
            if (valid[u]) sum = add(sum, p);
#pragma unroll
            for (int i = 0; i < DIMS; i++) {
                float a = fmaf(p, vj[32 * i], acc[i]);
                acc[i] = valid[u] ? a : acc[i];
            }
        }
#pragma unroll
        for (int i = 0; i < DIMS; i++) wout[warp][lane + 32 * i] = acc[i];
        if (lane == 0) wsum[warp] = sum;
        __syncthreads();
        float *pc = mine + (size_t)c * (hd + 2);
        for (int d = tid; d < hd; d += ATT_THREADS) {
            float o = wout[0][d];
#pragma unroll
            for (int w = 1; w < ATT_WARPS; w++) o = add(o, wout[w][d]);
            pc[2 + d] = o;
        }
        if (tid == 0) {
            float s = wsum[0];
#pragma unroll
            for (int w = 1; w < ATT_WARPS; w++) s = add(s, wsum[w]);
            pc[0] = m;
            pc[1] = s;
        }
        __syncthreads();
    }
    // The last block to finish combines; the counter is left at zero for the next launch.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int blocks = min(chunks, (int)gridDim.z);
        last = atomicAdd(count + rh, 1) == blocks - 1;
        if (last) count[rh] = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float M = -INFINITY;
#pragma unroll 8
    for (int c = 0; c < chunks; c++) M = fmaxf(M, __ldcg(mine + (size_t)c * (hd + 2)));
    float S = 0.f;
#pragma unroll 8
    for (int c = 0; c < chunks; c++) {
        const float *pc = mine + (size_t)c * (hd + 2);
        S = add(S, mul(__ldcg(pc + 1), expf(sub(__ldcg(pc), M))));
    }
    for (int d = tid; d < hd; d += ATT_THREADS) {
        float o = 0.f;
#pragma unroll 8
        for (int c = 0; c < chunks; c++) {
            const float *pc = mine + (size_t)c * (hd + 2);
            o = add(o, mul(__ldcg(pc + 2 + d), expf(sub(__ldcg(pc), M))));
        }
        out[rh * hd + d] = o / S;
    }
}

// One kernel per head width (32, 64, 128, 256).
#define ATTENTION(HD)                                                                           \
    extern "C" __global__ void attention_##HD(const float *q, const float *kcache,             \
                                              const float *vcache, const int *params, int T,   \
                                              int nh, int nkv, int capacity, int window,       \
                                              float scale, float *out, float *part,            \
                                              int *count) {                                    \
        attend<HD / WARP>(q, kcache, vcache, params, T, nh, nkv, capacity, window, scale, out, \
                          part, count);                                                        \
    }
ATTENTION(32)
ATTENTION(64)
ATTENTION(128)
ATTENTION(256)

// Moves the keys and values of a kept tree path to the slots a chain would have filled, in
// one layer's cache: slots[i] → base + i, in order (a later node never reads a slot an earlier
// one wrote). A block per key/value head (kv_heads of them: the grid).
extern "C" __global__ void keep_path(float *kcache, float *vcache, const int *slots, int len,
                                     int base, int kv_heads, int capacity, int hd) {
    int lh = blockIdx.x;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        for (int i = 0; i < len; i++) {
            size_t from = ((size_t)lh * capacity + slots[i]) * hd + e;
            size_t to = ((size_t)lh * capacity + base + i) * hd + e;
            kcache[to] = kcache[from];
            vcache[to] = vcache[from];
        }
    }
}

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
