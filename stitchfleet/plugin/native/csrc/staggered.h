// The CPU kernel's large outputs, each at its own offset within its pages (staggered), in memory recycled from
// step to step (not TF's allocator's).
//
// Why staggered: TF's CPU allocator hands every large tensor out at the same offset within its first page
// (measured: 592 for every 1 MB tensor of a TF 2.15 process), so the streams of a stitched loop that reads and
// writes many of them at the same index all map to the same cache sets, and a cluster with more large streams
// than the L1 has ways evicts its own lines. scripts/kernel_instructions.py timed the Transformer's GELU-backward
// clusters (14 buffers of 1 MB) at 455 us with every buffer at one offset and 200 us with only the outputs
// staggered (same instructions).
//
// Why recycled: TF's CPU allocator is glibc's malloc, which gives a freed block of this size back to the kernel
// (a trimmed heap top, an unmapped chunk), so the kernel's first store to each page of an output faulted a
// zeroed page in on every call: on the 2-core AVX2 machine of session 42, ~250 page faults a step of the demo's
// stitched step were the kernels' stores (perf's minor-faults), against ~30 for plain TF's own step. Blocks
// here are pages mapped for them alone (outside malloc's heaps), go back to a free list of their size when their
// tensor dies and serve the next call of that size: a training step allocates the same sizes every step, so the
// pages stay mapped.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/allocator.h"
#include "tensorflow/core/framework/types.h"

namespace {

constexpr size_t kStaggerPage = 4096;
constexpr size_t kStaggerLine = 64;
constexpr size_t kStaggerStep = 5;          // lines between consecutive offsets (odd: all 64 in turn)
constexpr size_t kStaggerFrom = 32 * 1024;  // smaller outputs stay in the caches whatever their offset

std::atomic<unsigned long> staggered_count{0};  // outputs allocated here, for the tests (ctypes)

// Blocks that no tensor holds, by size in bytes. The sizes are a job's static output shapes (a page more), so a
// list per size is reused step after step. Idle bytes above kIdleLimit are unmapped (a job whose shapes keep
// changing would otherwise keep every size it ever saw).
constexpr size_t kIdleLimit = size_t{1} << 30;

class RecyclingAllocator : public tensorflow::Allocator {
 public:
  std::string Name() override { return "stitchfleet_recycling"; }

  void *AllocateRaw(size_t alignment, size_t num_bytes) override {
    {
      std::lock_guard<std::mutex> hold(lock_);
      auto found = idle_.find(num_bytes);
      if (found != idle_.end() && !found->second.empty()) {
        void *block = found->second.back();
        found->second.pop_back();
        idle_bytes_ -= num_bytes;
        sizes_[block] = num_bytes;
        reused_.fetch_add(1, std::memory_order_relaxed);
        return block;
      }
    }
    // Mapped pages of its own, not malloc's: a block held in malloc's heap split it, and plain TF's own step in the
    // same process then faulted 900-1900 pages a step (BERT's corpus graph) where it had faulted ~100.
    if (alignment > kStaggerPage) return nullptr;  // pages: every alignment TF asks for (64)
    void *block = mmap(nullptr, Mapped(num_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> hold(lock_);
    sizes_[block] = num_bytes;
    return block;
  }

  void DeallocateRaw(void *ptr) override {
    if (ptr == nullptr) return;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> hold(lock_);
      auto found = sizes_.find(ptr);
      if (found == sizes_.end()) return;  // not ours: TF never hands another allocator's pointer here
      bytes = found->second;
      sizes_.erase(found);
      if (idle_bytes_ + bytes <= kIdleLimit) {
        idle_[bytes].push_back(ptr);
        idle_bytes_ += bytes;
        return;
      }
    }
    munmap(ptr, Mapped(bytes));
  }

  // Blocks handed out again from the idle lists (the tests read it: the second step reuses the first's).
  long reused() const { return reused_.load(std::memory_order_relaxed); }

 private:
  static size_t Mapped(size_t bytes) {
    return (std::max<size_t>(bytes, 1) + kStaggerPage - 1) / kStaggerPage * kStaggerPage;
  }

  std::mutex lock_;
  std::unordered_map<size_t, std::vector<void *>> idle_;
  std::unordered_map<void *, size_t> sizes_;  // the size of every block a tensor holds
  size_t idle_bytes_ = 0;
  std::atomic<long> reused_{0};
};

// One per process and never destroyed: a tensor may outlive any scope here (TF frees it when its last reader is
// done, maybe at the process's exit).
RecyclingAllocator &recycling() {
  static auto *allocator = new RecyclingAllocator();
  return *allocator;
}

// A CPU output of `type` and `shape`: staggered when large, else as TF's allocate_temp gives it. A large one is a
// block of the recycling allocator one page more than the output needs, and the output a slice of it that starts
// at the offset wanted within its page. (Memory of our own allocated afresh per call, session 11's aligned_alloc,
// made the Transformer's stitched step 5-7% slower than plain TF's: its pages faulted in on every call.)
Status AllocateOutput(OpKernelContext *ctx, DataType type, const TensorShape &shape, Tensor *out) {
  const size_t size = tensorflow::DataTypeSize(type);
  const size_t bytes = static_cast<size_t>(shape.num_elements()) * size;
  if (bytes < kStaggerFrom || size == 0) return ctx->allocate_temp(type, shape, out);
  const int64_t room = static_cast<int64_t>(bytes + kStaggerPage);
  Tensor block(&recycling(), tensorflow::DT_UINT8, TensorShape({room}));
  if (!block.IsInitialized() || block.tensor_data().data() == nullptr)
    return tensorflow::errors::ResourceExhausted("no memory for a stitched output of ", bytes, " bytes");
  const unsigned long n = staggered_count.fetch_add(1, std::memory_order_relaxed);
  const size_t wanted = (n * kStaggerStep % (kStaggerPage / kStaggerLine)) * kStaggerLine;
  const auto start = reinterpret_cast<uintptr_t>(block.tensor_data().data());
  const auto skip = static_cast<int64_t>((wanted + kStaggerPage - start % kStaggerPage) % kStaggerPage);
  return out->BitcastFrom(block.Slice(skip, skip + static_cast<int64_t>(bytes)), type, shape);
}

}  // namespace

// Outputs allocated staggered in this process (the tests read it).
extern "C" long stitchfleet_bridge_staggered(void) { return static_cast<long>(staggered_count.load()); }

// Of them, those whose memory came from a block an earlier output released (the tests read it).
extern "C" long stitchfleet_bridge_recycled(void) { return recycling().reused(); }
