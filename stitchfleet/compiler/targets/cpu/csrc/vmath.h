// Float transcendental functions the generated C calls (vmath.py says why and how accurate each is).

#ifdef __FAST_MATH__
#define sf_expf expf
#define sf_logf logf
#define sf_log1pf log1pf
#define sf_tanhf tanhf
#define sf_erff erff
#else
/* Polynomial steps as one fused multiply-add where the target has one (-march=native: one instruction, one
   rounding, so at least as accurate); without FMA fmaf would be a scalar libm call that stops vectorisation,
   so a multiply and an add there. The bounds in test_vmath hold for both (it checks both builds). */
#ifdef __FMA__
#define sf_fma(a, b, c) __builtin_fmaf(a, b, c)
#else
#define sf_fma(a, b, c) ((a) * (b) + (c))
#endif
static inline float sf_asfloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t sf_asuint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static inline float sf_expf(float x) {
  const float shift = 0x1.8p23f;
  float xc = x > 88.8f ? 88.8f : (x < -104.0f ? -104.0f : x);
  float kf = xc * 0x1.715476p+0f + shift;
  int32_t n = (int32_t)(sf_asuint(kf) - sf_asuint(shift));
  kf -= shift;
  float r = xc - kf * 0x1.62e4p-1f;
  r = r - kf * 0x1.7f7d1cp-20f;
  float p = 1.9875691500e-4f;
  p = sf_fma(p, r, 1.3981999507e-3f);
  p = sf_fma(p, r, 8.3334519073e-3f);
  p = sf_fma(p, r, 4.1665795894e-2f);
  p = sf_fma(p, r, 1.6666665459e-1f);
  p = sf_fma(p, r, 5.0000001201e-1f);
  p = p * r * r + r + 1.0f;
  int32_t h = n >> 1; /* floor, not n / 2: no sign fix-up; both halves stay normal (n in [-150, 128]) */
  float y = p * sf_asfloat((uint32_t)(h + 127) << 23) * sf_asfloat((uint32_t)(n - h + 127) << 23);
  y = x > 0x1.62e42ep+6f ? INFINITY : y;
  return x < -0x1.9fe368p+6f ? 0.0f : y;
}
static inline float sf_logf(float x) {
  uint32_t ix = sf_asuint(x);
  int tiny = ix < 0x00800000u;
  ix = sf_asuint(tiny ? x * 0x1p23f : x) + (0x3f800000u - 0x3f3504f3u);
  int32_t k = (int32_t)(ix >> 23) - 0x7f - (tiny ? 23 : 0);
  float f = sf_asfloat((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s, w = z * z;
  float t1 = w * (0xccce13.0p-25f + w * 0xf89e26.0p-26f);
  float t2 = z * (0xaaaaaa.0p-24f + w * 0x91e9ee.0p-25f);
  float hfsq = 0.5f * f * f, dk = (float)k;
  float y = s * (hfsq + (t2 + t1)) + dk * 9.0580006145e-06f - hfsq + f + dk * 6.9313812256e-01f;
  y = x < 0.0f ? NAN : y;
  y = x == 0.0f ? -INFINITY : y;
  return ((x == INFINITY) | (x != x)) ? x : y; /* | not ||: no branch, so loops calling it vectorise */
}
static inline float sf_log1pf(float x) {
  float u = 1.0f + x;
  float y = sf_logf(u) * (x / (u - 1.0f));
  y = u == 1.0f ? x : y;
  return x == INFINITY ? x : y;
}
static inline float sf_tanhf(float x) {
  float a = x < 0.0f ? -x : x;
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = sf_fma(p, z, 2.06390887954e-2f);
  p = sf_fma(p, z, -5.37397155531e-2f);
  p = sf_fma(p, z, 1.33314422036e-1f);
  p = sf_fma(p, z, -3.33332819422e-1f);
  float small = p * z * x + x;
  float big = 1.0f - 2.0f / (sf_expf(a + a) + 1.0f);
  big = x < 0.0f ? -big : big;
  return a < 0.625f ? small : big;
}
static inline float sf_erff(float x) {
  float a = __builtin_fabsf(x); /* one and, where a compare and a select took three */
  float z = x * x;
  float p = 0x1.6e7b9p-14f;
  p = sf_fma(p, z, -0x1.af45cep-11f);
  p = sf_fma(p, z, 0x1.555102p-8f);
  p = sf_fma(p, z, -0x1.b81cp-6f);
  p = sf_fma(p, z, 0x1.ce2ea2p-4f);
  p = sf_fma(p, z, -0x1.812746p-2f);
  p = sf_fma(p, z, 0x1.20dd76p+0f);
  /* Q is fitted on [0.875, 4]: t from |x| clamped there. Beyond 4, exp(-x^2) Q(t(4)) < 1.6e-8, below half
     an ulp under 1, so the result is +-1 as erf is. exp(-x^2) itself is not clamped: it is then the same
     expression as a GELU's exp(-x^2) term (erf(x) and exp(-x^2) of one x), which gcc computes once. */
  float ac = a < 4.0f ? a : 4.0f;
  float t = 1.0f / (1.0f + 0.5f * ac);
  float q = 0x1.ead13p-4f;
  q = sf_fma(q, t, -0x1.e440cap-2f);
  q = sf_fma(q, t, 0x1.21b468p-1f);
  q = sf_fma(q, t, -0x1.b109eep-4f);
  q = sf_fma(q, t, 0x1.653442p-2f);
  q = sf_fma(q, t, 0x1.099dbep-2f);
  q = sf_fma(q, t, 0x1.23cc64p-2f);
  q = sf_fma(q, t, -0x1.49e54ap-13f);
  float big = __builtin_copysignf(1.0f - sf_expf(-z) * q, x); /* x = -0 takes the other branch */
  /* A NaN needs no select of its own: a <= 0.875 is false for it, and big is NaN (sf_expf(NaN) is NaN). */
  return a <= 0.875f ? x * p : big;
}
#endif
