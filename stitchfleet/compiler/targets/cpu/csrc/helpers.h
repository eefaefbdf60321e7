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
