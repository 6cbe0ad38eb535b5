// Attention over the cache in chunks combined in a fixed order, and moving a kept tree path's
// keys and values to a chain's slots.
//
// Included by kernels.cu (one translation unit), in the order kernels.cu names.

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
// nothing of its arithmetic). Position j before the pass's is slot base + j of the row's
// sequence; the row's branch has its slots in the parameters (`row_branch`).
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
    int pos = row_cached(params, T, row), base = row_base(params, T, row);
    int n = row_position(params, T, row) + 1;
    int first = window > 0 ? max(0, n - window) : 0;
    int chunks = (n - first + CHUNK - 1) / CHUNK;
    if ((int)blockIdx.z >= chunks) return;
    const int *branch = row_branch(params, T, row);
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
        int start_slot = start < pos ? base + start : branch[start - pos];
#pragma unroll
        for (int u = 0; u < PER_WARP; u++) {
            int j = start + warp + ATT_WARPS * u;
            valid[u] = j < n;
            slot[u] = !valid[u] ? start_slot : j < pos ? base + j : branch[j - pos];
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
