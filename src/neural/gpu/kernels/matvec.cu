// The matrix kernels: a row's product with the pass's input rows (`row_dot`, `row_dot2`),
// and the three kernels built on it, `matvec`, `qkv_rope` and `gated`, for 1, 2, 4 and TOKENS
// rows of a pass a block.
//
// Included by kernels.cu (one translation unit), in the order kernels.cu names.

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
        if (TK == 1) {  // one row: a's four multiply-adds of a quad, then b's
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
    for (int u = u0; u < total; u += step) {
        float acc_a[TK], acc_b[TK];
        if (u >= rotated) {  // a value row, to the cache as it is
            int r = u - rotated, kh = r / hd, e = r % hd;
            row_dot<TK, TY>(mats.m[2], r, xs, lane, acc_a);
            if (lane < ntok) {
                float v = lane_row<TK>(acc_a, lane);
                if (mats.bias[2]) v = add(v, mats.bias[2][r]);
                vcache[((size_t)kh * capacity + row_slot(params, T, first + lane)) * hd + e] = v;
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
            int p = row_position(params, T, first + min(n, ntok - 1));
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
                              : kcache + ((size_t)h * capacity + row_slot(params, T, row)) * hd;
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
