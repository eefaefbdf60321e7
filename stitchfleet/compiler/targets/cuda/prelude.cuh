// The fixed CUDA C every rendered kernel starts with: includes and small device helpers (all `sf_`),
// read by prelude.py. They give CUDA code the kernel IR's semantics, which are those of `evaluate`
// (the numpy reference):
// - f16/bf16 arithmetic runs in float and rounds to the storage type after every op, as the sim does;
// - MAXIMUM/MINIMUM propagate NaN like np.maximum/np.minimum (fmaxf would drop it);
// - SIGN keeps NaN; f16/bf16 sums are native atomics on sm_80+; other 16-bit atomics, f64 and float
//   max/min are CAS loops;
// - `sf_grid_sync` is the grid barrier (see its comment for why it is hand written);
// - `sf_vec<T, N>` is an N-element vector aligned to its size, so a load of one is a single
//   4/8/16-byte memory instruction (LDG.E.64/128) when the address is aligned.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <typename T, int N>
struct __align__(sizeof(T) * N) sf_vec {
  T v[N];
};

__device__ __forceinline__ float sf_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float sf_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __half sf_h(float x) { return __float2half_rn(x); }
__device__ __forceinline__ __nv_bfloat16 sf_b(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__device__ __forceinline__ T sf_max(T a, T b) {
  return (a != a || a > b) ? a : b;
}
template <typename T>
__device__ __forceinline__ T sf_min(T a, T b) {
  return (a != a || a < b) ? a : b;
}
template <typename T>
__device__ __forceinline__ T sf_sign(T x) {
  return x != x ? x : (T)((x > (T)0) - (x < (T)0));
}

template <typename T>
__device__ __forceinline__ T sf_square(T x) {
  return x * x;
}
__device__ __forceinline__ float sf_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double sf_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

// Bit-level compare-and-swap on 2, 4 and 8 byte values: the loop every emulated atomic uses.
template <typename T, typename Op>
__device__ __forceinline__ void sf_atomic_apply(T *address, T value, Op op) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "unsupported atomic width");
  if constexpr (sizeof(T) == 2) {
    unsigned short *word = reinterpret_cast<unsigned short *>(address);
    unsigned short old = *word, assumed;
    do {
      assumed = old;
      T current = *reinterpret_cast<T *>(&assumed);
      T next = op(current, value);
      old = atomicCAS(word, assumed, *reinterpret_cast<unsigned short *>(&next));
    } while (assumed != old);
  } else if constexpr (sizeof(T) == 4) {
    unsigned int *word = reinterpret_cast<unsigned int *>(address);
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      T next = op(*reinterpret_cast<T *>(&assumed), value);
      old = atomicCAS(word, assumed, *reinterpret_cast<unsigned int *>(&next));
    } while (assumed != old);
  } else {
    unsigned long long *word = reinterpret_cast<unsigned long long *>(address);
    unsigned long long old = *word, assumed;
    do {
      assumed = old;
      T next = op(*reinterpret_cast<T *>(&assumed), value);
      old = atomicCAS(word, assumed, *reinterpret_cast<unsigned long long *>(&next));
    } while (assumed != old);
  }
}

struct sf_add_op {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
  __device__ __half operator()(__half a, __half b) const { return sf_h(sf_f(a) + sf_f(b)); }
  __device__ __nv_bfloat16 operator()(__nv_bfloat16 a, __nv_bfloat16 b) const { return sf_b(sf_f(a) + sf_f(b)); }
};
struct sf_max_op {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return sf_max(a, b);
  }
  __device__ __half operator()(__half a, __half b) const { return sf_h(sf_max(sf_f(a), sf_f(b))); }
  __device__ __nv_bfloat16 operator()(__nv_bfloat16 a, __nv_bfloat16 b) const { return sf_b(sf_max(sf_f(a), sf_f(b))); }
};
struct sf_min_op {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return sf_min(a, b);
  }
  __device__ __half operator()(__half a, __half b) const { return sf_h(sf_min(sf_f(a), sf_f(b))); }
  __device__ __nv_bfloat16 operator()(__nv_bfloat16 a, __nv_bfloat16 b) const { return sf_b(sf_min(sf_f(a), sf_f(b))); }
};

template <typename T>
__device__ __forceinline__ void sf_atomic_add(T *p, T v) {
  sf_atomic_apply(p, v, sf_add_op());
}
__device__ __forceinline__ void sf_atomic_add(float *p, float v) { atomicAdd(p, v); }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// Native 16-bit float atomics where the hardware has them (bf16 from sm_80; fp16 too, kept on the same
// arch line): one red.global.add instead of a compare-and-swap loop. The sum is rounded once, from the
// exact sum of the two 16-bit values; the loop rounds their float sum: the same value but in the
// rare case of a double rounding.
__device__ __forceinline__ void sf_atomic_add(__half *p, __half v) { atomicAdd(p, v); }
__device__ __forceinline__ void sf_atomic_add(__nv_bfloat16 *p, __nv_bfloat16 v) { atomicAdd(p, v); }
#endif
__device__ __forceinline__ void sf_atomic_add(int *p, int v) { atomicAdd(p, v); }
__device__ __forceinline__ void sf_atomic_add(long long *p, long long v) {
  atomicAdd(reinterpret_cast<unsigned long long *>(p), static_cast<unsigned long long>(v));
}
template <typename T>
__device__ __forceinline__ void sf_atomic_max(T *p, T v) {
  sf_atomic_apply(p, v, sf_max_op());
}
__device__ __forceinline__ void sf_atomic_max(int *p, int v) { atomicMax(p, v); }
__device__ __forceinline__ void sf_atomic_max(long long *p, long long v) { atomicMax(p, v); }
template <typename T>
__device__ __forceinline__ void sf_atomic_min(T *p, T v) {
  sf_atomic_apply(p, v, sf_min_op());
}
__device__ __forceinline__ void sf_atomic_min(int *p, int v) { atomicMin(p, v); }
__device__ __forceinline__ void sf_atomic_min(long long *p, long long v) { atomicMin(p, v); }

// Grid barrier for a launch whose blocks are all resident at once (the planner caps the grid
// at one wave and the runtime re-checks it against the real occupancy before launching).
// Hand written instead of cooperative_groups::grid_group::sync() because that needs
// cuLaunchCooperativeKernel, which pycuda does not expose. One 32-bit counter, never reset:
// block 0 adds 0x80000000 - (gridDim.x - 1) and every other block adds 1, so once all have
// arrived the counter has grown by exactly 0x80000000 and its top bit has flipped; each block
// spins until it sees the flip. __threadfence before arriving publishes this block's writes,
// the one after leaving orders its later reads after everyone's writes.
__device__ __forceinline__ void sf_grid_sync(unsigned int *counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
    __threadfence();
    unsigned int before = atomicAdd(counter, add);
    while (((before ^ *(volatile unsigned int *)counter) & 0x80000000u) == 0u) {
    }
    __threadfence();
  }
  __syncthreads();
}

// The cluster's non-finite flag: a stitched kernel notes a NaN/Inf it stores into an op output while the
// value is in a register (`sf_checked`: no extra pass over the output, no extra launch). The launch library
// points it at a word of mapped host memory when it loads the module, so the host reads it without a sync;
// null (a module loaded by anything else): nothing is noted.
extern "C" __device__ int *sf_nonfinite_flag = nullptr;

// Finite: |x| at most the largest finite value (false for NaN and both infinities); written with fabs so the
// same text compiles under NVRTC and as C++ on the CPU (cuda-cpu).
__device__ __forceinline__ bool sf_finite(float x) { return fabsf(x) <= 3.40282347e+38f; }
__device__ __forceinline__ bool sf_finite(double x) { return fabs(x) <= 1.7976931348623157e+308; }
__device__ __forceinline__ bool sf_finite(__half x) { return sf_finite(__half2float(x)); }
__device__ __forceinline__ bool sf_finite(__nv_bfloat16 x) { return sf_finite(__bfloat162float(x)); }

template <typename T>
__device__ __forceinline__ T sf_checked(T x) {
  if (!sf_finite(x) && sf_nonfinite_flag != nullptr) *(volatile int *)sf_nonfinite_flag = 1;
  return x;
}
