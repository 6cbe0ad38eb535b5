// One row at a time: the embedding of a pass's tokens, and the norm added after a block.
//
// Included by kernels.cu (one translation unit), in the order kernels.cu names.

// x[row] = dequantized embedding of tokens[row] (· scale, when scale ≠ 0).
extern "C" __global__ void embed(Mat table, const int *params, float scale, float *x) {
    int row = blockIdx.x;
    int token = row_token(params, row);
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
