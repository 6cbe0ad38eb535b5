// The rotation of q and k by position, and the cache write of k and v.
//
// Included by kernels.cu (one translation unit), in the order kernels.cu names.

// Per row: q/k normed per head (when qnorm), rotated by the row's position, q kept in place and
// k, v written to the cache at the row's slot (the parameters: `row_slot` in common.cuh). Block
// per row, a warp per head.
extern "C" __global__ void rope_cache(float *q, const float *k, const float *v, const int *params,
                                      int T, int nh, int nkv, int hd, const float *qnorm,
                                      const float *knorm, float eps, const float *cos_t,
                                      const float *sin_t, int interleaved, float *kcache,
                                      float *vcache, int capacity) {
    int row = blockIdx.x, lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    int warps = blockDim.x / WARP, half = hd / 2;
    int p = row_position(params, T, row), slot = row_slot(params, T, row);
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
