// Stitched task ranges on TF's own intra-op worker threads: the runner a CPU cluster's `_pooled` entry calls
// once per planned loop (the generated C's `sf_runner`, compiler/targets/cpu/csrc/helpers.h).
//
// Why: the C's own OpenMP team opens only from 4M elements touched (a team beside TF's pools waits on a
// descheduled thread), so on models of the demo's or a Transformer's size every stitched kernel ran serially
// on the executor's thread while TF's element-wise ops spread over its intra-op pool. Here a loop from
// kPoolElements elements touched is cut into blocks that the op's thread and the device's worker threads claim
// (the op's thread never waits for a block nobody started), and a loaded machine turns the hand-out off for a
// while (`judge`). At 16x64x256 the demo's stitched ops ran alone, on one thread, 9 of a 45 ms step's wall
// (benchmarks/README.md, "Session 18").
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "common.h"
#include "tensorflow/core/platform/threadpool.h"

namespace {

typedef void (*TaskRange)(void *arg, int64_t lo, int64_t hi);
typedef void (*Runner)(void *pool, int64_t tasks, int64_t cost, TaskRange body, void *arg);
typedef int (*Pooled)(void *const *buffers, Runner run, void *pool);

// Below this many elements touched a loop runs on the op's own thread. Handing out costs a closure scheduled and a
// worker woken (microseconds), and on a machine without a free core the worker's CPU (it spins for more work
// before it sleeps) comes out of the step: loops of the demo's size (up to 147K) lost 8-12% CPU handed out from
// 16-32K on the shared 2-core machine, while the 16x64x256 encoder's (262K-1.5M) did not. From 64K looked better at
// 16x64x256 with two cores free and cost the demo's size CPU under load: open until a quiet machine's
// scripts/bench_pool.py (benchmarks/README.md, "Session 18").
constexpr int64_t kPoolElements = int64_t{1} << 18;
// A claimed block is at least this many elements touched (a worker that wakes late still finds work worth
// taking), and a loop is cut into at most kBlocksPerThread blocks per thread (an even finish).
constexpr int64_t kBlockElements = int64_t{1} << 13;
constexpr int64_t kBlocksPerThread = 4;

std::atomic<int64_t> pool_elements{kPoolElements};  // settable by benchmarks (stitchfleet_bridge_pool_elements)
std::atomic<long> pooled_loops{0};                  // loops run through TF's pool
std::atomic<long> shards_worker{0};                 // blocks of them that ran on another thread than the op's own

// One handed-out loop: its blocks are claimed in order by the op's thread and whichever workers start while any
// is left. Held by a shared_ptr: a helper that starts after the loop returned finds nothing left and touches
// neither `body` nor `arg` (the caller's frame).
struct HandedOut {
  TaskRange body;
  void *arg;
  int64_t tasks, per_block, blocks;
  std::thread::id caller;
  std::atomic<int64_t> next{0};  // the next unclaimed block
  std::atomic<int64_t> done{0};  // blocks finished

  void claim() {
    for (int64_t b = next.fetch_add(1, std::memory_order_relaxed); b < blocks;
         b = next.fetch_add(1, std::memory_order_relaxed)) {
      if (std::this_thread::get_id() != caller) shards_worker.fetch_add(1, std::memory_order_relaxed);
      body(arg, b * per_block, std::min(tasks, (b + 1) * per_block));
      done.fetch_add(1, std::memory_order_release);  // the block's stores, seen by the caller's acquire
    }
  }
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Backing off: a loop whose op thread, done with every unclaimed block, then waited longer for a worker's block
// than it had worked itself, and over kWaitSlackNs, saw that worker lose its core mid-block (another process,
// another op: a loaded machine). Such a wait lasts a scheduler slice (milliseconds), so loops run inline for a
// while, twice as long after each such loop in a row (kBackoffMinNs to kBackoffMaxNs); a short wait resets it.
// On a quiet machine it still fires now and then (the step's own threads outnumber 2 cores), so it is short:
// with or without it a quiet 16x64x256 step took the same time (benchmarks/README.md, "Session 18").
constexpr int64_t kBackoffMinNs = 1'000'000, kBackoffMaxNs = 100'000'000, kWaitSlackNs = 200'000;
std::atomic<int64_t> inline_until{0};
std::atomic<int64_t> backoff_ns{kBackoffMinNs};
std::atomic<long> backoffs{0};

void judge(int64_t waited, int64_t worked) {
  if (waited <= std::max(worked, kWaitSlackNs)) {
    backoff_ns.store(kBackoffMinNs, std::memory_order_relaxed);
    return;
  }
  const int64_t length = backoff_ns.load(std::memory_order_relaxed);
  inline_until.store(now_ns() + length, std::memory_order_relaxed);
  backoff_ns.store(std::min(length * 2, kBackoffMaxNs), std::memory_order_relaxed);
  backoffs.fetch_add(1, std::memory_order_relaxed);
}

// Why not ParallelFor: it hands each worker a fixed range and the op's thread waits for every range, so a loop
// whose range sits queued behind a busy worker (a matmul beside it, or a core another process holds) waited for
// it: stitched steps lost wall on a loaded machine. Here the op's thread takes every block no worker has claimed,
// and waits only for blocks already running.
void run_on_tf_pool(void *pool, int64_t tasks, int64_t cost, TaskRange body, void *arg) {
  auto *workers = static_cast<tensorflow::thread::ThreadPool *>(pool);
  pooled_loops.fetch_add(1, std::memory_order_relaxed);
  const int64_t threads = std::max(workers->NumThreads(), 1);
  if (tasks < 2 || threads < 2 || tasks * cost < pool_elements.load(std::memory_order_relaxed)) {
    body(arg, 0, tasks);
    return;
  }
  const int64_t per_block = std::max((tasks + threads * kBlocksPerThread - 1) / (threads * kBlocksPerThread),
                                     (kBlockElements + cost - 1) / cost);
  const int64_t blocks = (tasks + per_block - 1) / per_block;
  if (blocks < 2) {
    body(arg, 0, tasks);
    return;
  }
  const int64_t started = now_ns();
  if (started < inline_until.load(std::memory_order_relaxed)) {
    body(arg, 0, tasks);
    return;
  }
  auto loop = std::make_shared<HandedOut>();
  loop->body = body;
  loop->arg = arg;
  loop->tasks = tasks;
  loop->per_block = per_block;
  loop->blocks = blocks;
  loop->caller = std::this_thread::get_id();
  // the op's thread is one of the loop's threads: one helper fewer (on a pool thread, it is one of the pool's)
  for (int64_t i = 1; i < std::min(threads, blocks); ++i) workers->Schedule([loop] { loop->claim(); });
  loop->claim();
  const int64_t claimed = now_ns();
  while (loop->done.load(std::memory_order_acquire) < blocks) std::this_thread::yield();  // blocks still running
  judge(now_ns() - claimed, claimed - started);
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

// Loops run on TF's pool since the library loaded (`what` 0), their blocks that ran on a TF worker thread other
// than the calling op's (`what` 1), and the times a loop's wait turned the hand-out off (`what` 2): the plugin's
// and the tests' view of where stitched tasks ran.
extern "C" long stitchfleet_bridge_pool_count(int what) {
  return what == 0 ? pooled_loops.load() : what == 1 ? shards_worker.load() : backoffs.load();
}

// Elements touched from which a loop is handed out (`value` < 0: unchanged); returns the previous value. For
// benchmarks that compare thresholds in one process (scripts/bench_pool.py).
extern "C" long stitchfleet_bridge_pool_elements(long value) {
  const long before = static_cast<long>(pool_elements.load());
  if (value >= 0) pool_elements.store(value);
  return before;
}
