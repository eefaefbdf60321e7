/* The harness of scripts/kernel_instructions.py: one generated cluster entry, called alone.
 *
 * Input: kernel_params.h, generated per cluster (its entry's name as SF_ENTRY, SF_NPARAMS and sf_fill, which
 * allocates and fills each buffer from the xorshift state). Output: with SF_TIMED, the fastest of SF_REPS calls
 * in ns on stdout; else SF_REPS + 1 calls for callgrind to count. The return codes go to stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernel_params.h"

int SF_ENTRY(void *const *b);

/* The next uniform in [0, 1) of a fixed xorshift sequence: the same inputs on every build. */
double sf_uniform(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return (double)(*s >> 11) * 0x1p-53;
}

int main(void) {
  uint64_t s = 88172645463325252ull;
  void *b[SF_NPARAMS > 0 ? SF_NPARAMS : 1];
  sf_fill(b, &s);
  int rc = 0;
#ifdef SF_TIMED
  double best = 1e30;
  for (int r = 0; r < SF_REPS; ++r) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc |= SF_ENTRY(b);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    best = ns < best ? ns : best;
  }
  printf("%.0f\n", best);
#else
  for (int r = 0; r < SF_REPS + 1; ++r) rc |= SF_ENTRY(b);
#endif
  fprintf(stderr, "rc %d\n", rc);
  return 0;
}
