// polyattn CUDA-family kernels: what differs between the family's compilers.
//
// One source serves NVIDIA and AMD. The kernels include common.cuh, which includes this file
// first (src/kernels/cuda/sources.rs pastes both in place of their include lines, so no
// compiler needs an include path). It gives every kernel the same names:
//
//   PA_NVIDIA, PA_AMD        which vendor the device code is compiled for (exactly one is 1)
//   PA_WAVE                  threads of a warp / wavefront, a compile-time constant: 32 on
//                            NVIDIA; on AMD the target's wavefront (64 on CDNA: gfx90a,
//                            gfx942; 32 on RDNA: gfx1030, gfx1100), from the compiler
//   PA_WAVE_LOG2             log2(PA_WAVE) (lane and warp ids as mask and shift, as the
//                            kernels were tuned on NVIDIA: signed / and % cost more)
//   pa_shfl_xor(v, m)        v of lane (lane ^ m) of the same warp / wavefront
//   pa_shfl(v, src)          v of lane `src` of the same warp / wavefront
//   pa_ldg(p)                *p through the read-only data path where there is one
//   PA_LAUNCH_BOUNDS(t, b)   at most t threads per CTA (NVIDIA: and b CTAs per SM wanted)
//
// Shuffles require every lane of the warp / wavefront to take part (the kernels call them
// only from warp-uniform control flow).
//
// Compilers, and what each provides:
//   NVRTC / nvcc (__CUDACC__): the CUDA built-ins (threadIdx, uint4, expf, __int_as_float,
//     ...); inline PTX is allowed (PA_NVIDIA code only).
//   hiprtc / hipcc (__HIP__ with ROCm's headers: hiprtc includes them itself, hipcc is run
//     with -include hip/hip_runtime.h): HIP's built-ins, the same names as CUDA's.
//   clang -x hip -nogpuinc -nogpulib -DPA_NO_GPU_HEADERS (no ROCm at all: the CI compile
//     check for targets that Debian's ROCm 5.2 does not know, gfx942 and gfx1100): the
//     qualifiers, built-in variables, vector types, bit casts, integer min / max and the float
//     functions the kernels call are defined below on clang's AMDGPU builtins. Without ROCm's
//     math library there is no tanhf; the one below is exp-based. Code built this way is for
//     compile and resource checks: a device's kernels come from hiprtc, with ROCm's math.

#ifndef POLYATTN_PORTABILITY_CUH
#define POLYATTN_PORTABILITY_CUH

#if defined(__HIP__) || defined(__HIPCC_RTC__)
#define PA_AMD 1
#define PA_NVIDIA 0
#elif defined(__CUDACC__)
#define PA_AMD 0
#define PA_NVIDIA 1
#else
#error "polyattn kernels: compile with NVRTC / nvcc (CUDA) or hiprtc / hipcc / clang -x hip"
#endif

#if PA_NVIDIA

#define PA_WAVE 32
#define PA_WAVE_LOG2 5
#define PA_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
__device__ __forceinline__ float pa_shfl_xor(float v, int m) {
    return __shfl_xor_sync(0xffffffffu, v, m);
}
__device__ __forceinline__ float pa_shfl(float v, int src) {
    return __shfl_sync(0xffffffffu, v, src);
}
template <typename T>
__device__ __forceinline__ T pa_ldg(const T* p) {
    return __ldg(p);
}

#else  // PA_AMD

#if defined(__HIP_DEVICE_COMPILE__) && !defined(__AMDGCN_WAVEFRONT_SIZE)
#error "polyattn kernels: the compiler does not say the target's wavefront size"
#endif
#ifdef __AMDGCN_WAVEFRONT_SIZE
#define PA_WAVE __AMDGCN_WAVEFRONT_SIZE
#else
#define PA_WAVE 64  // host pass of a single-source compile: no kernel is generated
#endif
#if PA_WAVE == 64
#define PA_WAVE_LOG2 6
#elif PA_WAVE == 32
#define PA_WAVE_LOG2 5
#else
#error "polyattn kernels: wavefronts of 32 or 64 lanes only"
#endif
// HIP's second __launch_bounds__ argument means waves per execution unit, not CTAs per SM:
// only the thread count is passed.
#define PA_LAUNCH_BOUNDS(threads, min_blocks) \
    __attribute__((amdgpu_flat_work_group_size(1, threads)))

#ifdef PA_NO_GPU_HEADERS

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))

struct pa_dim3 {
    unsigned x, y, z;
};
__device__ __forceinline__ pa_dim3 pa_thread_idx() {
    return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
            __builtin_amdgcn_workitem_id_z()};
}
__device__ __forceinline__ pa_dim3 pa_block_idx() {
    return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
            __builtin_amdgcn_workgroup_id_z()};
}
__device__ __forceinline__ pa_dim3 pa_block_dim() {
    return {__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
            __builtin_amdgcn_workgroup_size_z()};
}
// HSA grid sizes count work-items; CUDA's gridDim counts CTAs.
__device__ __forceinline__ pa_dim3 pa_grid_dim() {
    return {__builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
            __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
            __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z()};
}
#define threadIdx (pa_thread_idx())
#define blockIdx (pa_block_idx())
#define blockDim (pa_block_dim())
#define gridDim (pa_grid_dim())

__device__ __forceinline__ void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
struct __attribute__((aligned(8))) int2 {
    int x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
__device__ __forceinline__ uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return {x, y, z, w};
}
__device__ __forceinline__ uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
__device__ __forceinline__ int2 make_int2(int x, int y) { return {x, y}; }
__device__ __forceinline__ float4 make_float4(float x, float y, float z, float w) {
    return {x, y, z, w};
}

__device__ __forceinline__ float __int_as_float(int i) { return __builtin_bit_cast(float, i); }
__device__ __forceinline__ float __uint_as_float(unsigned u) {
    return __builtin_bit_cast(float, u);
}
__device__ __forceinline__ unsigned __float_as_uint(float f) {
    return __builtin_bit_cast(unsigned, f);
}
__device__ __forceinline__ int __float_as_int(float f) { return __builtin_bit_cast(int, f); }
__device__ __forceinline__ int min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ float fminf(float a, float b) { return __builtin_fminf(a, b); }
__device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
__device__ __forceinline__ float fabsf(float x) { return __builtin_fabsf(x); }
__device__ __forceinline__ float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
__device__ __forceinline__ float expf(float x) { return __builtin_expf(x); }
__device__ __forceinline__ float logf(float x) { return __builtin_logf(x); }
__device__ __forceinline__ float sqrtf(float x) { return __builtin_sqrtf(x); }
__device__ __forceinline__ float rintf(float x) { return __builtin_rintf(x); }
// The hardware's sin / cos (the intrinsics' accuracy class) and pow as exp2(e·log2(b)): the
// AMDGPU backend lowers these without a device math library.
__device__ __forceinline__ float __sinf(float x) { return __builtin_sinf(x); }
__device__ __forceinline__ float __cosf(float x) { return __builtin_cosf(x); }
__device__ __forceinline__ float powf(float b, float e) {
    return __builtin_exp2f(e * __builtin_log2f(b));
}
__device__ __forceinline__ float ldexpf(float x, int e) { return __builtin_ldexpf(x, e); }
__device__ __forceinline__ float tanhf(float x) {
    const float t = __builtin_expf(-2.0f * __builtin_fabsf(x));
    return __builtin_copysignf((1.0f - t) / (1.0f + t), x);
}

__device__ __forceinline__ int pa_lane_id() {
    return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}
__device__ __forceinline__ float pa_shfl(float v, int src) {
    const int r = __builtin_amdgcn_ds_bpermute(src << 2, __builtin_bit_cast(int, v));
    return __builtin_bit_cast(float, r);
}
__device__ __forceinline__ float pa_shfl_xor(float v, int m) {
    return pa_shfl(v, pa_lane_id() ^ m);
}

#else  // ROCm's headers

__device__ __forceinline__ float pa_shfl_xor(float v, int m) { return __shfl_xor(v, m); }
__device__ __forceinline__ float pa_shfl(float v, int src) { return __shfl(v, src); }

#endif  // PA_NO_GPU_HEADERS
// AMD's scalar / vector caches serve read-only data without a separate load path.
template <typename T>
__device__ __forceinline__ T pa_ldg(const T* p) {
    return *p;
}
#endif  // PA_AMD

#endif  // POLYATTN_PORTABILITY_CUH
