/* The exhaustive check of scripts/kernel_erf_check.py: the generated code's sf_erff on every float in [0, 4.5].
 *
 * Input: csrc/vmath.h on the include path (built with and without FMA by the script). Output: on stdout, the
 * largest distance in float32 ulps from glibc's double erf rounded to float, where it is, how many inputs are
 * beyond 1 and 2 ulp, the largest relative error for normal results and the largest absolute error of
 * 1 + erf(-x), both in units of 2^-24; exit 1 when sf_erff is not odd or mishandles NaN, infinities or -0.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmath.h"

/* Monotone integer order of floats across the sign: the ulp distance is a difference. */
static int64_t order(float f) {
  int32_t i;
  memcpy(&i, &f, 4);
  return i < 0 ? -(int64_t)2147483648LL - i : i;
}

int main(void) {
  int64_t worst = 0;
  float worst_x = 0.0f, worst_rel_x = 0.0f;
  double worst_rel = 0.0, worst_gelu = 0.0;
  long beyond1 = 0, beyond2 = 0;
  for (uint32_t u = 0; u < 0x40900000u; ++u) { /* +0 up to 4.5 */
    float x;
    memcpy(&x, &u, 4);
    const float got = sf_erff(x);
    const double exact = erf((double)x);
    const int64_t d = llabs(order(got) - order((float)exact));
    if (d > worst) worst = d, worst_x = x;
    beyond1 += d > 1;
    beyond2 += d > 2;
    if (x > 1e-37f && fabs(got - exact) / exact * 0x1p24 > worst_rel) {
      worst_rel = fabs(got - exact) / exact * 0x1p24, worst_rel_x = x;
    }
    /* 1 + erf(-x), rounded as float code would: what a GELU keeps of erf where it cancels */
    const double kept = fabs((double)(1.0f - got) - (1.0 - exact)) * 0x1p24;
    if (kept > worst_gelu) worst_gelu = kept;
    if (sf_erff(-x) != -got) {
      printf("not odd at %a\n", x);
      return 1;
    }
  }
  printf(
      "max %lld ulp at %a; beyond 1 ulp %ld, beyond 2 ulp %ld of %u inputs; max relative error %.2f x 2^-24 at %a; "
      "1 + erf(-x) max absolute error %.2f x 2^-24\n",
      (long long)worst, worst_x, beyond1, beyond2, 0x40900000u, worst_rel, worst_rel_x, worst_gelu);
  const int special = isnan(sf_erff(NAN)) && sf_erff(INFINITY) == 1.0f && sf_erff(-INFINITY) == -1.0f &&
                      signbit(sf_erff(-0.0f)) && sf_erff(-0.0f) == 0.0f;
  if (!special) printf("NaN, an infinity or -0 mishandled\n");
  return special ? 0 : 1;
}
