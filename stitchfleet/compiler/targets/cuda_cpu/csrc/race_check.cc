// The shared-memory race check of cuda-cpu's race builds (module.py adds it with -fsanitize=thread).
//
// GCC's thread-sanitizer pass calls __tsan_readN/__tsan_writeN before every load and store of the unit and
// turns atomics into __tsan_atomic* calls; no TSan runtime is linked: these definitions are the runtime.
// For an access by a CUDA thread (a fiber) to its block's shared memory (the extern buffer, or a static
// array the checked build registered with SF_SHARED_FILL), a shadow word records, per barrier generation,
// the thread that wrote it and the thread(s) that read it, as compute-sanitizer's racecheck does: a write
// and another thread's read or write of the same word with no __syncthreads between is a hazard, and the
// launch fails with which threads, which word and the kind. Atomics are exempt (they are atomic), and so
// are accesses between lanes of one warp that a *_sync intrinsic orders in between (the warp's sync count
// is in the shadow). Each shared access also yields to another fiber with probability 1/8 (a per-block
// xorshift): interleavings a barrier-to-barrier schedule never shows happen, and their results differ.
#include <pthread.h>

#include <unordered_map>

namespace {

struct sf_shadow {
  unsigned long gen;       // the block's barrier generation of the entries below
  int writer;              // thread that wrote the word in this generation, -1: none
  int reader;              // thread that read it, -1: none, -2: several
  unsigned long warp_gen;  // the writer's warp sync count at the write (warp-ordered accesses are not races)
};

struct sf_race_state {
  std::unordered_map<uintptr_t, sf_shadow> words;
  sf_block *block = nullptr;
  uint64_t seed = 0;
  bool shared = false;  // the last access checked was to shared memory
  std::string message;
};

// A pointer, not an object: a thread_local with a constructor gets an instrumented init function, whose
// accesses would come back here before it has run.
thread_local sf_race_state *sf_race = nullptr;
pthread_key_t sf_race_key;  // frees a worker thread's state when the thread ends
pthread_once_t sf_race_once = PTHREAD_ONCE_INIT;

__attribute__((no_sanitize_thread)) void sf_race_free(void *state) { delete static_cast<sf_race_state *>(state); }
__attribute__((no_sanitize_thread)) void sf_race_key_make() { pthread_key_create(&sf_race_key, sf_race_free); }
unsigned long sf_checked_accesses = 0;  // shared-memory accesses checked, all threads (sf_race_checked)
thread_local bool sf_checking = false;  // set while sf_check runs

__attribute__((no_sanitize_thread)) const char *sf_shared_name(sf_block *b, uintptr_t word, size_t *offset) {
  uintptr_t dyn = reinterpret_cast<uintptr_t>(sf_smem);
  if (word >= dyn && word < dyn + b->launch->dyn_smem) {
    *offset = word - dyn;
    return "extern __shared__";
  }
  for (const auto &range : b->shared_ranges) {
    uintptr_t base = reinterpret_cast<uintptr_t>(range.first);
    if (word >= base && word < base + range.second) {
      *offset = word - base;
      return "static __shared__";
    }
  }
  return nullptr;
}

// Whether this access makes a hazard (described in sf_race->message then); updates the shadow words. False
// for memory that is not the block's shared memory (and sf_race->shared says so).
__attribute__((no_sanitize_thread)) bool sf_check(sf_block *b, void *address, size_t size, bool write) {
  uintptr_t first = reinterpret_cast<uintptr_t>(address) & ~uintptr_t{3};
  size_t offset = 0;
  const char *where = sf_shared_name(b, first, &offset);
  sf_race->shared = where != nullptr;
  if (where == nullptr) return false;
  __atomic_fetch_add(&sf_checked_accesses, 1ul, __ATOMIC_RELAXED);
  if (sf_race->block != b) {
    sf_race->words.clear();
    sf_race->block = b;
    sf_race->seed = 0x9e3779b97f4a7c15ull * (b->index + 1) + 0x51ed27;
  }
  int tid = static_cast<int>(b->current->tid);
  unsigned long warp_gen = b->warp_syncs[tid >> 5];
  for (uintptr_t word = first; word < reinterpret_cast<uintptr_t>(address) + size; word += 4) {
    sf_shadow &s = sf_race->words[word];
    if (s.gen != b->bar_gen + 1) s = {b->bar_gen + 1, -1, -1, 0};  // +1: a default entry is no generation
    bool same_warp_ordered = s.writer >= 0 && (s.writer >> 5) == (tid >> 5) && s.warp_gen != warp_gen;
    const char *kind = nullptr;
    int other = -1;
    if (s.writer >= 0 && s.writer != tid && !same_warp_ordered) {
      kind = write ? "write after write" : "read after write";
      other = s.writer;
    } else if (write && s.reader != -1 && s.reader != tid) {
      kind = "write after read";
      other = s.reader;
    }
    if (kind != nullptr) {
      sf_race->message = std::string("shared-memory race (") + kind + ") in block " + std::to_string(b->index) +
                         ": thread " + std::to_string(tid) + " and thread " +
                         (other >= 0 ? std::to_string(other) : "(several)") + " on " + where + " byte " +
                         std::to_string(offset + (word - first)) +
                         " with no __syncthreads between (barrier generation " + std::to_string(b->bar_gen) + ")";
      return true;
    }
    if (write) {
      s.writer = tid;
      s.warp_gen = warp_gen;
      s.reader = -1;
    } else {
      s.reader = s.reader == -1 || s.reader == tid ? tid : -2;
    }
  }
  return false;
}

__attribute__((no_sanitize_thread)) void sf_access(void *address, size_t size, bool write) {
  sf_block *b = sf_cur_block;
  if (sf_checking || b == nullptr || !b->in_fiber || b->current == nullptr) return;
  if (b->launch->abort.load(std::memory_order_relaxed)) return;
  // The fiber's own accesses only: the scheduler's (instrumented too, some while in_fiber is already set) run
  // on the OS thread's stack, and a yield from there would save the scheduler's context as the fiber's.
  char *frame = static_cast<char *>(__builtin_frame_address(0));
  if (frame < b->current->stack || frame >= b->current->stack + SF_STACK_BYTES) return;
  sf_checking = true;  // the containers sf_check uses are instrumented: their accesses come back here
  if (sf_race == nullptr) {
    sf_race = new sf_race_state();
    pthread_once(&sf_race_once, sf_race_key_make);
    pthread_setspecific(sf_race_key, sf_race);
  }
  bool hazard = sf_check(b, address, size, write);
  sf_checking = false;
  if (hazard) sf_fail(sf_race->message);
  if (!sf_race->shared) return;
  uint64_t &x = sf_race->seed;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  if ((x & 7) == 0) {
    b->progress++;  // a yield the scheduler must not mistake for a deadlock
    sf_yield();
  }
}

}  // namespace

// How many shared-memory accesses the check has seen in this unit: evidence it looked at a kernel at all.
extern "C" __attribute__((no_sanitize_thread)) unsigned long sf_race_checked(void) {
  return __atomic_load_n(&sf_checked_accesses, __ATOMIC_RELAXED);
}

#define SF_TSAN_ACCESS(N)                                                                                           \
  extern "C" __attribute__((no_sanitize_thread)) void __tsan_read##N(void *p) { sf_access(p, N, false); }           \
  extern "C" __attribute__((no_sanitize_thread)) void __tsan_write##N(void *p) { sf_access(p, N, true); }           \
  extern "C" __attribute__((no_sanitize_thread)) void __tsan_unaligned_read##N(void *p) { sf_access(p, N, false); } \
  extern "C" __attribute__((no_sanitize_thread)) void __tsan_unaligned_write##N(void *p) { sf_access(p, N, true); }
SF_TSAN_ACCESS(1)
SF_TSAN_ACCESS(2)
SF_TSAN_ACCESS(4)
SF_TSAN_ACCESS(8)
SF_TSAN_ACCESS(16)

extern "C" __attribute__((no_sanitize_thread)) void __tsan_read_range(void *p, long n) {
  sf_access(p, static_cast<size_t>(n), false);
}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_write_range(void *p, long n) {
  sf_access(p, static_cast<size_t>(n), true);
}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_init() {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_func_entry(void *) {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_func_exit(void *) {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_vptr_update(void *, void *) {}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_atomic_thread_fence(int) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
extern "C" __attribute__((no_sanitize_thread)) void __tsan_atomic_signal_fence(int) {
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

// Atomics run as atomics (sequentially consistent whatever the order asked) and are not race-checked.
#define SF_TSAN_ATOMIC(N, T)                                                                                     \
  extern "C" __attribute__((no_sanitize_thread)) T __tsan_atomic##N##_load(const volatile void *a, int) {        \
    return __atomic_load_n(static_cast<const volatile T *>(a), __ATOMIC_SEQ_CST);                                \
  }                                                                                                              \
  extern "C" __attribute__((no_sanitize_thread)) void __tsan_atomic##N##_store(volatile void *a, T v, int) {     \
    __atomic_store_n(static_cast<volatile T *>(a), v, __ATOMIC_SEQ_CST);                                         \
  }                                                                                                              \
  extern "C" __attribute__((no_sanitize_thread)) T __tsan_atomic##N##_exchange(volatile void *a, T v, int) {     \
    return __atomic_exchange_n(static_cast<volatile T *>(a), v, __ATOMIC_SEQ_CST);                               \
  }                                                                                                              \
  SF_TSAN_RMW(N, T, add)                                                                                         \
  SF_TSAN_RMW(N, T, sub)                                                                                         \
  SF_TSAN_RMW(N, T, and)                                                                                         \
  SF_TSAN_RMW(N, T, or)                                                                                          \
  SF_TSAN_RMW(N, T, xor)                                                                                         \
  SF_TSAN_RMW(N, T, nand)                                                                                        \
  extern "C" __attribute__((no_sanitize_thread)) bool __tsan_atomic##N##_compare_exchange_strong(                \
      volatile void *a, void *expected, T desired, int, int) {                                                   \
    return __atomic_compare_exchange_n(static_cast<volatile T *>(a), static_cast<T *>(expected), desired, false, \
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                                      \
  }                                                                                                              \
  extern "C" __attribute__((no_sanitize_thread)) bool __tsan_atomic##N##_compare_exchange_weak(                  \
      volatile void *a, void *expected, T desired, int, int) {                                                   \
    return __atomic_compare_exchange_n(static_cast<volatile T *>(a), static_cast<T *>(expected), desired, true,  \
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                                      \
  }                                                                                                              \
  extern "C" __attribute__((no_sanitize_thread)) T __tsan_atomic##N##_compare_exchange_val(                      \
      volatile void *a, T expected, T desired, int, int) {                                                       \
    __atomic_compare_exchange_n(static_cast<volatile T *>(a), &expected, desired, false, __ATOMIC_SEQ_CST,       \
                                __ATOMIC_SEQ_CST);                                                               \
    return expected;                                                                                             \
  }
#define SF_TSAN_RMW(N, T, OP)                                                                                  \
  extern "C" __attribute__((no_sanitize_thread)) T __tsan_atomic##N##_fetch_##OP(volatile void *a, T v, int) { \
    return __atomic_fetch_##OP(static_cast<volatile T *>(a), v, __ATOMIC_SEQ_CST);                             \
  }
SF_TSAN_ATOMIC(8, unsigned char)
SF_TSAN_ATOMIC(16, unsigned short)
SF_TSAN_ATOMIC(32, unsigned int)
SF_TSAN_ATOMIC(64, unsigned long)
