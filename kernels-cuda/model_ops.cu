// Model operations around attention (embedding gather, RMSNorm, linear, RoPE, SiLU*mul,
// residual add) for src/compute/cuda.rs. Kernels to come.

#include "common.cuh"
