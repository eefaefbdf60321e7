// The compatibility header that lets g++ compile the CUDA renderer's text for the CPU (cuda-cpu).
//
// Put before the rendered source of a unit (module.py); launcher.cc, put after the kernels, defines what it
// declares. Model (CUDA semantics, as far as one CPU can show them):
// - every CUDA thread is a fiber (its own stack; a ten-instruction x86-64 switch that, unlike swapcontext, makes
//   no signal-mask system call) that yields only at __syncthreads and warp intrinsics; a block's fibers run on
//   one OS thread, so __shared__ is thread_local (per running block) and extern __shared__ binds to a
//   per-OS-thread buffer filled with the launch's fill byte (0xff: NaN in every float type) before each block;
//   checked builds fill static shared arrays too (SF_SHARED_FILL, added by module.py), so a read of shared
//   memory no thread wrote shows up as NaN, and as a difference between two fill bytes;
// - __syncthreads releases when every live thread of the block waits; a *_sync intrinsic releases when every
//   lane of its mask waits with that mask; warps are 32 lanes; shuffles follow PTX shfl.sync (idx/up/down/bfly
//   segment and clamp rules);
// - atomics are GCC __atomic builtins (the renderer's own CAS loops do the rest); the arrival atomic of the
//   prelude's grid barrier waits for the barrier to open (see sf_grid_wait) instead of leaving the prelude's
//   loop to spin;
// - blocks run concurrently (one OS thread per block for grid-barrier kernels, else a pool of two) or, when the
//   launch asks (blocks >= 0), one at a time in a given order.
// The launch's debug flag: a barrier reached by part of a block, two different barriers met at once, a mask
// naming an exited lane, a shuffle reading a lane outside its mask, and mismatched masks abort the launch with a
// message. Checked builds (SF_CHECKED) turn -fsanitize=alignment reports into launch errors. Fibers of a block
// run in thread order, reversed, or reshuffled every round (order): all are legal schedules, so a result that
// changes with the order has a missing barrier.
#pragma once
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if !defined(__x86_64__)
#error "cuda-cpu switches fibers with x86-64 code (sf_switch)"
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ thread_local

struct sf_dim3 {
  unsigned x, y, z;
};

// ---- 16-bit float storage types (arithmetic is done in float by the prelude) ----
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, 2);
  return (float)f;
}
inline __half __float2half_rn(float x) {
  _Float16 f = (_Float16)x;
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}
inline __half __double2half(double x) {
  _Float16 f = (_Float16)x;
  __half h;
  std::memcpy(&h.bits, &f, 2);
  return h;
}
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  __nv_bfloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    b.bits = (uint16_t)((u >> 16) | 0x40u);
    return b;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  b.bits = (uint16_t)(u >> 16);
  return b;
}
inline float __int_as_float(int x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline float __int_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline double __longlong_as_double(long long x) {
  double d;
  std::memcpy(&d, &x, 8);
  return d;
}
inline long long __double_as_longlong(double x) {
  long long i;
  std::memcpy(&i, &x, 8);
  return i;
}
// CUDA's isfinite/isnan/isinf are global functions, as in C
using std::isfinite;
using std::isinf;
using std::isnan;
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

// ---- runtime state -------------------------------------------------------------------
struct sf_block;
struct sf_fiber {
  void *sp;  // saved stack pointer while switched out
  unsigned tid;
  bool done;
  char *stack;
};
struct sf_warp {
  uint64_t value[32];
  uint64_t result[32];
  unsigned lane_mask[32];
  int kind[32];
  int arg[32];
  int width[32];
  unsigned arrived;
  unsigned done;
};
struct sf_launch;
struct sf_block {
  sf_launch *launch;
  unsigned index;
  std::vector<sf_fiber> fibers;
  std::vector<sf_warp> warps;
  void *sched_sp;
  unsigned live;
  unsigned bar_count;
  unsigned long bar_gen;
  int bar_line;
  unsigned long progress;
  unsigned votes[2];  // __syncthreads_or/and/count: true predicates per barrier generation (by parity)
  unsigned position;  // in the launch's block sequence
  sf_fiber *current;
  std::vector<void *> filled;                            // static shared arrays this block has filled (checked builds)
  std::vector<std::pair<void *, size_t>> shared_ranges;  // the same with their sizes (race builds)
  std::vector<unsigned long> warp_syncs;                 // completed *_sync intrinsics per warp (race builds)
  bool in_fiber;  // a fiber runs (not the scheduler): the race check looks at its accesses only
};
struct sf_launch {
  unsigned grid, block;
  size_t dyn_smem;
  int order;  // fibers of a block each round: 0 in thread order, 1 reversed, 2 shuffled
  bool debug;
  unsigned char fill;
  unsigned *grid_counter;  // the grid barrier's counter (null: the kernel has none)
  // blocks: -1 run concurrently (a pool of two OS threads; one each with a grid barrier);
  // 0, 1, >= 2 one at a time (a baton passed in `sequence` order: index, reversed, shuffled
  // with the value as seed), so that atomics across blocks happen in one reproducible order.
  int blocks;
  std::vector<unsigned> sequence;  // position -> block index
  std::vector<char> finished;      // per position (serial grid-barrier launches)
  unsigned baton = 0;              // the position allowed to run
  std::mutex baton_mutex;
  std::condition_variable baton_cv;
  std::atomic<bool> abort{false};
  std::mutex mutex;
  std::string error;
};

// The runtime's state is defined here (inline variables), so the header needs nothing the launcher defines.
inline thread_local sf_block *sf_cur_block = nullptr;
inline thread_local sf_dim3 sf_block_idx;
extern thread_local unsigned char *sf_dyn_smem_ptr;
inline sf_dim3 sf_grid_dim, sf_block_dim;

struct sf_thread_idx_t {
  unsigned x, y, z;
};
inline sf_thread_idx_t sf_thread_idx() { return {sf_cur_block->current->tid, 0, 0}; }
#define threadIdx (sf_thread_idx())
#define blockIdx (sf_block_idx)
#define blockDim (sf_block_dim)
#define gridDim (sf_grid_dim)

// Saves the callee-saved registers on this stack, stores the stack pointer in *save and
// resumes the stack `next` (defined in the launcher). The only state a fiber has besides its
// stack: the kernels never change the rounding mode, so MXCSR and the x87 word are not switched.
extern "C" __attribute__((visibility("hidden"))) void sf_switch(void **save, void *next);

// Ends the calling fiber's launch with `message` (empty: another thread's abort): no fiber is resumed after it.
[[noreturn]] inline void sf_fail(const std::string &message) {
  sf_launch *l = sf_cur_block->launch;
  if (!message.empty()) {
    std::lock_guard<std::mutex> lock(l->mutex);
    if (l->error.empty()) l->error = message;
  }
  l->abort.store(true);
  {
    std::lock_guard<std::mutex> lock(l->baton_mutex);
    l->baton_cv.notify_all();
  }
  sf_cur_block->current->done = true;
  sf_switch(&sf_cur_block->current->sp, sf_cur_block->sched_sp);  // a done fiber is never resumed
  std::abort();
}

inline void sf_yield() {
  sf_block *b = sf_cur_block;
  sf_switch(&b->current->sp, b->sched_sp);
  if (b->launch->abort.load(std::memory_order_relaxed)) sf_fail("");
}

// Opens barrier generation g: the slot of g + 1 is cleared, as every thread has read g - 1's votes (it read
// them before it arrived at g).
inline void sf_bar_release(sf_block *b) {
  b->bar_count = 0;
  b->bar_gen++;
  b->votes[b->bar_gen & 1] = 0;
}

// Returns after every live thread of the block arrived; with `pred` >= 0 it votes, and the returned value is
// the number of live threads that voted true.
inline unsigned sf_syncthreads_vote(int line, int pred) {
  sf_block *b = sf_cur_block;
  b->progress++;
  if (b->launch->debug) {
    if (b->live != b->fibers.size())
      sf_fail("__syncthreads reached after " + std::to_string(b->fibers.size() - b->live) + " thread(s) of block " +
              std::to_string(b->index) + " exited (a barrier reached by part of a block)");
    if (b->bar_count > 0 && b->bar_line != line)
      sf_fail("threads of block " + std::to_string(b->index) + " wait at different barriers (lines " +
              std::to_string(b->bar_line) + " and " + std::to_string(line) + ")");
  }
  b->bar_line = line;
  unsigned long gen = b->bar_gen;
  unsigned slot = gen & 1;
  if (pred > 0) b->votes[slot]++;
  if (++b->bar_count == b->live) {
    unsigned votes = b->votes[slot];
    sf_bar_release(b);
    return votes;
  }
  while (b->bar_gen == gen) sf_yield();
  return b->votes[slot];
}
inline void sf_syncthreads(int line) { (void)sf_syncthreads_vote(line, -1); }
inline int sf_syncthreads_or(int line, int pred) { return sf_syncthreads_vote(line, pred != 0) != 0; }
inline int sf_syncthreads_count(int line, int pred) { return (int)sf_syncthreads_vote(line, pred != 0); }
inline int sf_syncthreads_and(int line, int pred) {
  unsigned live = sf_cur_block->live;  // the same before and after: no thread exits inside a barrier
  return sf_syncthreads_vote(line, pred != 0) == live;
}
#define __syncthreads() sf_syncthreads(__LINE__)
#define __syncthreads_or(pred) sf_syncthreads_or(__LINE__, (pred))
#define __syncthreads_and(pred) sf_syncthreads_and(__LINE__, (pred))
#define __syncthreads_count(pred) sf_syncthreads_count(__LINE__, (pred))

// Checked builds: a static shared array is filled with the launch's byte when its block
// first declares it (before any thread of the block can have written it: the declarations
// open the kernel and no fiber yields before them), as extern shared memory is.
inline void sf_shared_fill(void *p, size_t n) {
  sf_block *b = sf_cur_block;
  for (void *q : b->filled)
    if (q == p) return;
  // Race builds: the check reads shared_ranges on every access, and the instrumented vector code reports its
  // stores before making them, so the check would walk a half-grown vector (new start, old end) into heap
  // garbage, take any address for shared memory and yield in the middle of the update. Not checked meanwhile.
  b->in_fiber = false;
  b->filled.push_back(p);
  b->shared_ranges.emplace_back(p, n);
  b->in_fiber = true;
  std::memset(p, b->launch->fill, n);
}
#define SF_SHARED_FILL(name) sf_shared_fill(static_cast<void *>(name), sizeof(name))

inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

enum { SF_IDX = 0, SF_UP = 1, SF_DOWN = 2, SF_XOR = 3, SF_BALLOT = 4 };

inline void sf_warp_complete(sf_block *b, sf_warp &w, unsigned mask, unsigned warp_base) {
  for (unsigned lane = 0; lane < 32; lane++) {
    if (!(mask & (1u << lane))) continue;
    if (w.kind[lane] == SF_BALLOT) {
      unsigned bits = 0;
      for (unsigned l = 0; l < 32; l++)
        if ((mask & (1u << l)) && w.value[l]) bits |= 1u << l;
      w.result[lane] = bits;
      continue;
    }
    // PTX shfl.sync: c = ((32 - width) << 8) | 0x1f (0 for up); segmask = c >> 8.
    unsigned width = (unsigned)w.width[lane];
    unsigned segmask = (32u - width) & 31u;
    unsigned cval = w.kind[lane] == SF_UP ? 0u : 31u;
    unsigned max_lane = (lane & segmask) | (cval & ~segmask);
    unsigned min_lane = lane & segmask;
    unsigned bval = (unsigned)w.arg[lane];
    unsigned j = lane;
    bool ok = true;
    switch (w.kind[lane]) {
      case SF_IDX:
        j = min_lane | (bval & ~segmask);
        ok = j <= max_lane;
        break;
      case SF_UP:
        j = lane - bval;
        ok = (int)j >= (int)max_lane;
        break;
      case SF_DOWN:
        j = lane + bval;
        ok = j <= max_lane;
        break;
      case SF_XOR:
        j = lane ^ bval;
        ok = j <= max_lane;
        break;
    }
    if (!ok) j = lane;
    j &= 31u;
    if (!(mask & (1u << j))) {
      if (b->launch->debug)
        sf_fail("shuffle: lane " + std::to_string(warp_base + lane) + " reads lane " + std::to_string(j) +
                " outside its mask");
    }
    w.result[lane] = w.value[j];
  }
}

inline uint64_t sf_warp_op(int kind, unsigned mask, uint64_t value, int arg, int width) {
  sf_block *b = sf_cur_block;
  b->progress++;
  unsigned tid = b->current->tid, lane = tid & 31u;
  sf_warp &w = b->warps[tid >> 5];
  unsigned base = tid & ~31u;
  if (b->launch->debug) {
    if (!(mask & (1u << lane)))
      sf_fail("thread " + std::to_string(tid) + " calls a *_sync intrinsic with a mask without itself");
    for (unsigned l = 0; l < 32; l++) {
      if (!(mask & (1u << l))) continue;
      if (base + l >= b->fibers.size() || b->fibers[base + l].done)
        sf_fail("mask of thread " + std::to_string(tid) + " names lane " + std::to_string(l) +
                " which has exited or does not exist");
    }
  }
  w.value[lane] = value;
  w.kind[lane] = kind;
  w.arg[lane] = arg;
  w.width[lane] = width;
  w.lane_mask[lane] = mask;
  w.arrived |= 1u << lane;
  for (;;) {
    if (w.done & (1u << lane)) break;
    if ((w.arrived & mask) == mask) {
      bool same = true;
      for (unsigned l = 0; l < 32; l++)
        if ((mask & (1u << l)) && w.lane_mask[l] != mask) same = false;
      if (same) {
        sf_warp_complete(b, w, mask, base);
        b->warp_syncs[tid >> 5]++;
        w.arrived &= ~mask;
        w.done |= mask;
        break;
      }
      if (b->launch->debug) {
        for (unsigned l = 0; l < 32; l++)
          if ((mask & (1u << l)) && w.lane_mask[l] != mask && (w.lane_mask[l] & mask) != 0)
            sf_fail("lanes of warp " + std::to_string(tid >> 5) + " wait in *_sync intrinsics with different masks");
      }
    }
    sf_yield();
  }
  w.done &= ~(1u << lane);
  b->progress++;
  return w.result[lane];
}

template <typename T>
inline T sf_shfl(int kind, unsigned mask, T var, int arg, int width) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  uint64_t got = sf_warp_op(kind, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}
template <typename T>
inline T __shfl_sync(unsigned m, T v, int lane, int w = 32) {
  return sf_shfl(SF_IDX, m, v, lane, w);
}
template <typename T>
inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) {
  return sf_shfl(SF_UP, m, v, (int)d, w);
}
template <typename T>
inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) {
  return sf_shfl(SF_DOWN, m, v, (int)d, w);
}
template <typename T>
inline T __shfl_xor_sync(unsigned m, T v, int d, int w = 32) {
  return sf_shfl(SF_XOR, m, v, d, w);
}
inline unsigned __ballot_sync(unsigned m, int pred) {
  return (unsigned)sf_warp_op(SF_BALLOT, m, pred ? 1u : 0u, 0, 32);
}
inline void __syncwarp(unsigned m = 0xffffffffu) { (void)sf_warp_op(SF_BALLOT, m, 0, 0, 32); }
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline int __all_sync(unsigned m, int pred) { return __ballot_sync(m, pred) == m; }

// ---- atomics --------------------------------------------------------------------------
template <typename T>
inline T atomicCAS(T *p, T expected, T desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
template <typename T>
inline T atomicAdd(T *p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

// The one place the header knows the prelude's grid barrier (sf_grid_sync: each block adds to
// one counter, whose top bit flips when the last arrives, then spins reading it). Its spin
// has no intrinsic to yield at, and with one OS thread per block (264 on an H200 profile) on a
// few cores, spinning blocks would burn the time slices of those still working. So the
// arrival atomic on that counter returns only once the bit has flipped (a legal schedule: the
// thread is merely slow), sleeping on a futex the last arrival wakes; the prelude's own spin
// then reads the flip at once. A wait that sees no change for 2 s returns and leaves the
// spinning to the prelude's loop, so another barrier protocol would be slow, never stuck.
inline void sf_baton_pass(sf_launch *l, unsigned pos, bool finishing) {
  std::lock_guard<std::mutex> lock(l->baton_mutex);
  if (finishing) l->finished[pos] = 1;
  for (unsigned k = 1; k <= l->grid; k++) {
    unsigned next = (pos + k) % l->grid;
    if (!l->finished[next]) {
      l->baton = next;
      break;
    }
  }
  l->baton_cv.notify_all();
}
inline void sf_baton_wait(sf_launch *l, unsigned pos) {
  std::unique_lock<std::mutex> lock(l->baton_mutex);
  // timed: an abort raised under another mutex may notify before this thread sleeps
  while (
      !l->baton_cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return l->baton == pos || l->abort.load(); })) {
  }
}

// Serial launches: the arriving block hands the baton on until it comes back after the flip.
inline void sf_grid_wait_serial(unsigned *counter, unsigned before) {
  sf_launch *l = sf_cur_block->launch;
  unsigned pos = sf_cur_block->position;
  while (!l->abort.load()) {
    sf_baton_pass(l, pos, false);
    sf_baton_wait(l, pos);
    if (((before ^ __atomic_load_n(counter, __ATOMIC_SEQ_CST)) & 0x80000000u) != 0) return;
  }
}

inline void sf_grid_wait(unsigned *counter, unsigned before, unsigned added) {
  if (sf_cur_block->launch->blocks >= 0) return sf_grid_wait_serial(counter, before);
  if (((before ^ (before + added)) & 0x80000000u) != 0) {
    syscall(SYS_futex, counter, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    return;
  }
  const struct timespec slice = {0, 1000000};
  unsigned last = before + added, quiet_ms = 0;
  while (quiet_ms < 2000 && !sf_cur_block->launch->abort.load()) {
    unsigned seen = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
    if (((before ^ seen) & 0x80000000u) != 0) return;
    quiet_ms = seen == last ? quiet_ms + 1 : 0;
    last = seen;
    syscall(SYS_futex, counter, FUTEX_WAIT_PRIVATE, seen, &slice, nullptr, 0);
  }
}
inline unsigned atomicAdd(unsigned *p, unsigned v) {
  unsigned before = __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  if (sf_cur_block != nullptr && p == sf_cur_block->launch->grid_counter) sf_grid_wait(p, before, v);
  return before;
}
inline float atomicAdd(float *p, float v) {
  uint32_t *word = reinterpret_cast<uint32_t *>(p);
  uint32_t old = __atomic_load_n(word, __ATOMIC_SEQ_CST), next;
  do {
    float f;
    std::memcpy(&f, &old, 4);
    f += v;
    std::memcpy(&next, &f, 4);
  } while (!__atomic_compare_exchange_n(word, &old, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  float f;
  std::memcpy(&f, &old, 4);
  return f;
}
template <typename T>
inline T atomicMax(T *p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
template <typename T>
inline T atomicMin(T *p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
