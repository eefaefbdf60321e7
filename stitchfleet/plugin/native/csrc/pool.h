// Stitched task ranges on TF's own intra-op worker threads: the runner a CPU cluster's `_pooled` entry calls
// once per planned loop (the generated C's `sf_runner`, compiler/targets/cpu/csrc/helpers.h).
//
// Why: the C's own OpenMP team opens only from 4M elements touched (a team beside TF's pools waits on a
// descheduled thread), so on models of the demo's or a Transformer's size every stitched kernel ran serially
// on the executor's thread while TF's element-wise ops spread over its intra-op pool. Here a loop's tasks go to
// the op's device worker threads (`ParallelFor`: the calling thread takes a share and waits for the rest, as TF's
// Eigen kernels do); its cost model keeps a loop inline until the estimate pays for a second thread.
#pragma once

#include <thread>

#include "common.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

typedef void (*TaskRange)(void *arg, int64_t lo, int64_t hi);
typedef void (*Runner)(void *pool, int64_t tasks, int64_t cost, TaskRange body, void *arg);
typedef int (*Pooled)(void *const *buffers, Runner run, void *pool);

// ParallelFor's cost is in CPU cycles per task; the plan gives elements touched per task. A stitched element
// (loads, the stitched ops, a store: vectorised, memory-bound) takes a few cycles.
constexpr int64_t kCyclesPerElement = 4;
// Below this many elements touched a loop runs on the op's own thread whatever Eigen's model says (it would start
// a second thread from about 50K): on the shared 2-core machine the demo's loops (up to ~400K touched) lost
// ~10% CPU and wall handed out, while the Transformer-sized ones (1-2M) broke even (benchmarks/README.md, "threads").
constexpr int64_t kPoolElements = int64_t{1} << 19;

std::atomic<long> pooled_loops{0};   // loops run through TF's pool
std::atomic<long> shards_worker{0};  // shards of them that ran on another thread than the op's own

void run_on_tf_pool(void *pool, int64_t tasks, int64_t cost, TaskRange body, void *arg) {
  auto *workers = static_cast<tensorflow::thread::ThreadPool *>(pool);
  pooled_loops.fetch_add(1, std::memory_order_relaxed);
  if (tasks < 2 || tasks * cost < kPoolElements) {
    body(arg, 0, tasks);
    return;
  }
  const std::thread::id caller = std::this_thread::get_id();
  workers->ParallelFor(tasks, cost * kCyclesPerElement, [&](int64_t lo, int64_t hi) {
    if (std::this_thread::get_id() != caller) shards_worker.fetch_add(1, std::memory_order_relaxed);
    body(arg, lo, hi);
  });
}

// The op's device intra-op pool (nullptr when it has none, or STITCHFLEET_TF_POOL=0 in the environment, read once:
// the entry's own runner serves, as before this runner existed; benchmarks compare the two that way).
void *tf_pool(OpKernelContext *ctx) {
  static const bool off = [] {
    const char *value = std::getenv("STITCHFLEET_TF_POOL");
    return value != nullptr && std::string(value) == "0";
  }();
  if (off) return nullptr;
  const auto *threads = ctx->device()->tensorflow_cpu_worker_threads();
  return threads == nullptr ? nullptr : threads->workers;
}

// A cluster's `<function>_pooled` beside its `<function>_entry` (nullptr for objects built before it existed).
Pooled pooled_beside(void *handle, const std::string &entry) {
  const std::string suffix = "_entry";
  if (entry.size() <= suffix.size() || entry.compare(entry.size() - suffix.size(), suffix.size(), suffix) != 0)
    return nullptr;
  return reinterpret_cast<Pooled>(dlsym(handle, (entry.substr(0, entry.size() - suffix.size()) + "_pooled").c_str()));
}

}  // namespace

// Loops run on TF's pool since the library loaded (`what` 0), and their shards that ran on a TF worker thread
// other than the calling op's (`what` 1): the plugin's and the tests' view of where stitched tasks ran.
extern "C" long stitchfleet_bridge_pool_count(int what) {
  return what == 0 ? pooled_loops.load() : shards_worker.load();
}
