// Scalar helpers the cpu backend's C99 renders by name (cexpr.py), after vmath's sf_expf:
// f16/bf16 rounding, NaN-propagating max/min, relu/sign/abs, branch-free select, stable sigmoid.
static inline float sf_f16(float x) { return (float)(_Float16)x; }
static inline float sf_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return x;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}
#define SF_ORDERED(T)                                                               \
  static inline T sf_max_##T(T a, T b) { return ((a > b) | (a != a)) ? a : b; }     \
  static inline T sf_min_##T(T a, T b) { return ((a < b) | (a != a)) ? a : b; }     \
  static inline T sf_relu_##T(T a) { return a < 0 ? (T)0 : a; }                     \
  static inline T sf_sign_##T(T a) { return a > 0 ? (T)1 : (a < 0 ? (T) - 1 : a); } \
  static inline T sf_abs_##T(T a) { return a < 0 ? -a : a; }
SF_ORDERED(float)
SF_ORDERED(double)
SF_ORDERED(int32_t)
SF_ORDERED(int64_t)
#define SF_SELECT(T, U)                          \
  static inline T sf_sel_##T(bool c, T a, T b) { \
    U ua, ub, m = -(U)c;                         \
    memcpy(&ua, &a, sizeof ua);                  \
    memcpy(&ub, &b, sizeof ub);                  \
    ua = (ua & m) | (ub & ~m);                   \
    memcpy(&a, &ua, sizeof a);                   \
    return a;                                    \
  }
SF_SELECT(float, uint32_t)
SF_SELECT(double, uint64_t)
static inline float sf_sigmoid_float(float x) {
  float z = sf_expf(x < 0.0f ? x : -x);
  return x >= 0 ? 1.0f / (1.0f + z) : z / (1.0f + z);
}
static inline double sf_sigmoid_double(double x) {
  double z = exp(-fabs(x));
  return x >= 0 ? 1.0 / (1.0 + z) : z / (1.0 + z);
}

// A stitched cluster runs each planned loop as `body(arg, lo, hi)` over task ranges through a runner, one loop
// after the other (a runner returns when every task ran: the stage barrier). `cost`: elements touched per task.
// The function's own entries use OpenMP's runner; the TF bridge op passes one over TF's intra-op threads.
typedef void (*sf_task_range)(void *arg, int64_t lo, int64_t hi);
typedef void (*sf_runner)(void *pool, int64_t tasks, int64_t cost, sf_task_range body, void *arg);

// Below SF_PARALLEL_ELEMENTS elements touched (the generated unit defines it: generator.PARALLEL_ELEMENTS) the
// caller's thread runs every task; above, an OpenMP team splits them statically.
static void sf_run_omp(void *pool, int64_t tasks, int64_t cost, sf_task_range body, void *arg) {
  (void)pool;
  if (tasks < 2 || tasks * cost < SF_PARALLEL_ELEMENTS) {
    body(arg, 0, tasks);
    return;
  }
  omp_set_dynamic(1); /* threads = cores - load average: no team waits on a busy core */
#pragma omp parallel
  {
    const int64_t n = omp_get_num_threads(), w = omp_get_thread_num();
    const int64_t lo = tasks * w / n, hi = tasks * (w + 1) / n;
    if (lo < hi) body(arg, lo, hi);
  }
}
