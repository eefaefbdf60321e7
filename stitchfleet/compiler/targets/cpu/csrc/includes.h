// The cpu backend's C99 units open with these includes (cexpr.PRELUDE: includes.h, vmath, helpers.h).
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
