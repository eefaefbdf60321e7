// The runner scripts/bench_kernels.py passes to a cluster's `_pooled` entry: every task on the calling thread, as
// the TF op's runner does with a one-thread pool (plugin/native/csrc/pool.h), so the figures are the C's alone.
#include <stdint.h>

typedef void (*sf_task_range)(void *arg, int64_t lo, int64_t hi);

void sf_inline(void *pool, int64_t tasks, int64_t cost, sf_task_range body, void *arg) {
  (void)pool;
  (void)cost;
  body(arg, 0, tasks);
}
