// The launcher of the cuda-cpu runtime, appended after the rendered kernels of a unit (module.py).
//
// It defines what cuda_cpu.h declares: the fiber switch (x86-64 assembly), fiber stacks, the per-block
// scheduler (fibers in thread, reversed or reshuffled order; deadlock detection), the block sequence and the
// baton of serial launches, the worker threads, sf_launch_kernel (the entry every kernel's sf_entry_<name>
// calls), and, in checked builds, the -fsanitize=alignment handler.
thread_local __attribute__((aligned(16))) unsigned char sf_smem[SF_SMEM_CAPACITY];

static thread_local void (*sf_body)(void **);
static thread_local void **sf_args;
static thread_local sf_launch *sf_cur_launch;

struct sf_abort {};

asm(R"(
  .text
  .p2align 4
  .globl sf_switch
  .hidden sf_switch
  .type sf_switch, @function
sf_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size sf_switch, .-sf_switch

  .p2align 4
  .globl sf_fiber_start
  .hidden sf_fiber_start
  .type sf_fiber_start, @function
sf_fiber_start:
  andq $-16, %rsp
  call sf_fiber_main
  ud2
  .size sf_fiber_start, .-sf_fiber_start
)");

extern "C" __attribute__((visibility("hidden"))) void sf_fiber_start();

// A fresh fiber's stack: six zero registers for sf_switch to pop, then sf_fiber_start to return to.
static void *sf_fiber_stack(char *stack) {
  uint64_t *sp = reinterpret_cast<uint64_t *>(reinterpret_cast<uintptr_t>(stack + SF_STACK_BYTES) & ~uintptr_t{15});
  *--sp = 0;
  *--sp = reinterpret_cast<uint64_t>(&sf_fiber_start);
  for (int i = 0; i < 6; i++) *--sp = 0;
  return sp;
}

// Fiber stacks, kept per OS thread for the blocks it runs (freed when the thread ends).
static thread_local std::vector<std::unique_ptr<char[]>> sf_stacks;

extern "C" __attribute__((visibility("hidden"), used)) void sf_fiber_main() {
  sf_block *b = sf_cur_block;
  sf_body(sf_args);
  b->current->done = true;
  b->live--;
  b->progress++;
  if (b->bar_count > 0) {
    if (b->launch->debug)
      sf_fail("thread " + std::to_string(b->current->tid) + " of block " + std::to_string(b->index) +
              " exited while others wait at __syncthreads (a barrier reached by part of a block)");
    if (b->bar_count == b->live) sf_bar_release(b);
  }
  sf_switch(&b->current->sp, b->sched_sp);
  std::abort();
}

static void sf_shuffle(std::vector<unsigned> &turn, uint64_t &seed) {
  for (size_t i = turn.size(); i > 1; i--) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;  // xorshift64: deterministic per block
    std::swap(turn[i - 1], turn[seed % i]);
  }
}

static void sf_run_block(sf_launch *l, unsigned index, unsigned position) {
  sf_block b;
  b.launch = l;
  b.index = index;
  b.position = position;
  b.current = nullptr;
  b.live = l->block;
  b.bar_count = 0;
  b.bar_gen = 0;
  b.bar_line = 0;
  b.votes[0] = b.votes[1] = 0;
  b.in_fiber = false;
  b.warp_syncs.assign((l->block + 31) / 32, 0);
  b.progress = 0;
  b.fibers.resize(l->block);
  b.warps.resize((l->block + 31) / 32);
  for (auto &w : b.warps) {
    w.arrived = 0;
    w.done = 0;
  }
  sf_cur_block = &b;
  sf_block_idx = {index, 0, 0};
  std::memset(sf_smem, l->fill, l->dyn_smem);
  for (unsigned t = 0; t < l->block; t++) {
    sf_fiber &f = b.fibers[t];
    f.tid = t;
    f.done = false;
    if (sf_stacks.size() <= t) sf_stacks.emplace_back(new char[SF_STACK_BYTES]);  // untouched pages stay unmapped
    f.stack = sf_stacks[t].get();
    f.sp = sf_fiber_stack(f.stack);
  }
  std::vector<unsigned> turn(l->block);
  for (unsigned t = 0; t < l->block; t++) turn[t] = l->order == 1 ? l->block - 1 - t : t;
  uint64_t seed = 0x9e3779b97f4a7c15ull * (index + 1);
  unsigned finished = 0;
  while (finished < l->block && !l->abort.load()) {
    unsigned long before = b.progress;
    finished = 0;
    if (l->order == 2) sf_shuffle(turn, seed);  // a new order every round: any yield may be followed by any fiber
    for (unsigned k = 0; k < l->block && !l->abort.load(); k++) {
      unsigned t = turn[k];
      sf_fiber &f = b.fibers[t];
      if (f.done) {
        finished++;
        continue;
      }
      b.current = &f;
      b.in_fiber = true;
      sf_switch(&b.sched_sp, f.sp);
      b.in_fiber = false;
      if (f.done) finished++;
    }
    if (finished < l->block && b.progress == before && !l->abort.load()) {
      std::lock_guard<std::mutex> lock(l->mutex);
      if (l->error.empty())
        l->error = "deadlock in block " + std::to_string(index) + ": " + std::to_string(b.bar_count) + " of " +
                   std::to_string(b.live) + " live thread(s) wait at __syncthreads, the rest in warp intrinsics";
      l->abort.store(true);
      l->baton_cv.notify_all();  // under l->mutex, not baton_mutex: waiters also time out below
    }
  }
  sf_cur_block = nullptr;
}

// position >= 0: the one block of a serial grid-barrier launch this thread runs, baton in hand.
static void sf_worker(sf_launch *l, std::atomic<unsigned> *next, void (*body)(void **), void **args, int position) {
  sf_body = body;
  sf_args = args;
  sf_cur_launch = l;
  if (position >= 0) {
    unsigned pos = static_cast<unsigned>(position);
    sf_baton_wait(l, pos);
    if (!l->abort.load()) sf_run_block(l, l->sequence[pos], pos);
    sf_baton_pass(l, pos, true);
    return;
  }
  for (;;) {
    unsigned i = next->fetch_add(1);
    if (i >= l->grid || l->abort.load()) return;
    sf_run_block(l, l->sequence[i], i);
  }
}

static std::vector<unsigned> sf_block_sequence(unsigned grid, int blocks) {
  std::vector<unsigned> sequence(grid);
  for (unsigned i = 0; i < grid; i++) sequence[i] = blocks == 1 ? grid - 1 - i : i;
  uint64_t seed = 0x2545f4914f6cdd1dull * static_cast<uint64_t>(blocks);  // each value >= 2 its own order
  if (blocks >= 2) sf_shuffle(sequence, seed);
  return sequence;
}

static int sf_launch_kernel(void (*body)(void **), void **args, unsigned grid, unsigned block, size_t dyn_smem,
                            int grid_barrier, int order, int blocks, int debug, int fill, unsigned *counter,
                            char *error, size_t error_size) {
  if (dyn_smem > SF_SMEM_CAPACITY) {
    std::snprintf(error, error_size, "dynamic shared memory %zu > capacity %d", dyn_smem, SF_SMEM_CAPACITY);
    return 1;
  }
  sf_launch l;
  l.grid = grid;
  l.block = block;
  l.dyn_smem = dyn_smem;
  l.order = order;
  l.debug = debug != 0;
  l.grid_counter = grid_barrier ? counter : nullptr;
  l.blocks = blocks;
  l.sequence = sf_block_sequence(grid, blocks);
  l.finished.assign(grid, 0);
  l.fill = (unsigned char)fill;
  sf_grid_dim = {grid, 1, 1};
  sf_block_dim = {block, 1, 1};
  std::atomic<unsigned> next{0};
  unsigned workers = grid_barrier ? grid : (blocks >= 0 || grid < 2 ? (grid < 1 ? grid : 1) : 2);
  bool baton = grid_barrier && blocks >= 0;
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < workers; i++) threads.emplace_back(sf_worker, &l, &next, body, args, baton ? (int)i : -1);
  if (grid_barrier && counter != nullptr) {
    // A failed block never arrives at the grid barrier: while the launch is aborted keep
    // flipping the counter's top bit, so the blocks spinning there leave and see the abort.
    std::atomic<bool> stop{false};
    std::thread watcher([&] {
      while (!stop.load()) {
        if (l.abort.load()) __atomic_fetch_add(counter, 0x80000000u, __ATOMIC_SEQ_CST);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    for (auto &t : threads) t.join();
    stop.store(true);
    watcher.join();
  } else {
    for (auto &t : threads) t.join();
  }
  if (l.abort.load()) {
    std::snprintf(error, error_size, "%s", l.error.empty() ? "launch aborted" : l.error.c_str());
    return 1;
  }
  return 0;
}

#ifdef SF_CHECKED
// -fsanitize=alignment reports here instead of in libubsan (which would print and go on, or
// abort the whole process): a misaligned access aborts the launch with where it happened.
struct sf_ubsan_location {
  const char *file;
  unsigned line, column;
};
struct sf_ubsan_type {
  unsigned short kind, info;
  char name[1];
};
struct sf_ubsan_mismatch {
  sf_ubsan_location loc;
  const sf_ubsan_type *type;
  unsigned char log_alignment, check_kind;
};
extern "C" __attribute__((visibility("default"))) void __ubsan_handle_type_mismatch_v1(void *data, void *p) {
  const sf_ubsan_mismatch *d = static_cast<const sf_ubsan_mismatch *>(data);
  std::string what = "misaligned access at " + std::string(d->loc.file) + ":" + std::to_string(d->loc.line) +
                     ": address " + std::to_string(reinterpret_cast<uintptr_t>(p)) + " of type " + d->type->name +
                     " needs " + std::to_string(1u << d->log_alignment) + "-byte alignment";
  if (sf_cur_block != nullptr && sf_cur_block->current != nullptr) sf_fail(what);
  std::fprintf(stderr, "cuda-cpu: %s (outside a kernel)\n", what.c_str());
}
extern "C" __attribute__((visibility("default"))) void __ubsan_handle_type_mismatch_v1_abort(void *d, void *p) {
  __ubsan_handle_type_mismatch_v1(d, p);
  std::abort();
}
#endif

struct sf_ptr {
  void *p;
  template <typename T>
  operator T *() const {
    return static_cast<T *>(p);
  }
};
