// The blame kernels, compiled into every cluster's module beside its kernels (NVRTC, same options). The
// stitched kernels note a NaN/Inf they store themselves (sf_checked, in the prelude); on a call the op
// judges, TF's own ops run on the same inputs and sf_blame_<dtype>(ours, theirs, n, flag) sets *flag where a
// stitched value is NaN/Inf and TF's is finite: only that is the kernel's fault (an fp16 loss-scaling overflow
// or a -inf attention mask is non-finite in both).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define SF_BLAME(NAME, T, AS_FLOAT)                                                                      \
  extern "C" __global__ void NAME(const T *__restrict__ ours, const T *__restrict__ theirs, long long n, \
                                  volatile int *flag) {                                                  \
    int bad = 0;                                                                                         \
    const long long stride = (long long)gridDim.x * blockDim.x;                                          \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride)             \
      bad |= !isfinite(AS_FLOAT(ours[i])) && isfinite(AS_FLOAT(theirs[i]));                              \
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;                                            \
  }
#define SF_SAME(v) (v)
SF_BLAME(sf_blame_f32, float, SF_SAME)
SF_BLAME(sf_blame_f16, __half, __half2float)
SF_BLAME(sf_blame_bf16, __nv_bfloat16, __bfloat162float)
SF_BLAME(sf_blame_f64, double, SF_SAME)
