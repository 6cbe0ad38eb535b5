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

// The operations, in this order (each part uses those before it):
#include "kernels/common.cuh"
#include "kernels/matvec.cu"
#include "kernels/embed_norm.cu"
#include "kernels/rope.cu"
#include "kernels/attention.cu"
#include "kernels/pick.cu"
