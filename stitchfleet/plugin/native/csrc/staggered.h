// The CPU kernel's large outputs, each at its own offset within its pages (staggered), not TF's allocator's.
//
// Why: TF's CPU allocator hands every large tensor out at the same offset within its first page (measured:
// 592 for every 1 MB tensor of a TF 2.15 process), so the streams of a stitched loop that reads and writes
// many of them at the same index all map to the same cache sets, and a cluster with more large streams than
// the L1 has ways evicts its own lines. scripts/kernel_instructions.py timed the Transformer's GELU-backward
// clusters (14 buffers of 1 MB) at 455 us with every buffer at one offset and 200 us with only the outputs
// staggered (same instructions).
#pragma once

#include <atomic>
#include <cstdlib>

#include "common.h"
#include "tensorflow/core/framework/types.h"

namespace {

constexpr size_t kStaggerPage = 4096;
constexpr size_t kStaggerLine = 64;
constexpr size_t kStaggerStep = 5;          // lines between consecutive offsets (odd: all 64 in turn)
constexpr size_t kStaggerFrom = 32 * 1024;  // smaller outputs stay in the caches whatever their offset

std::atomic<unsigned long> staggered_count{0};  // outputs allocated here, for the tests (ctypes)

// A CPU output of `type` and `shape`: staggered when large, else as TF's allocate_temp gives it. The memory is
// still TF's allocator's, one page more than the output needs, and the output a slice of it that starts at the
// offset wanted within its page. Memory of our own (aligned_alloc per call) made the Transformer's stitched step
// 5-7% slower than plain TF's where TF's memory gave 6-9% faster (bench_step, load 2-3); fresh pages faulted in
// on every call are the likely cause (not measured).
Status AllocateOutput(OpKernelContext *ctx, DataType type, const TensorShape &shape, Tensor *out) {
  const size_t size = tensorflow::DataTypeSize(type);
  const size_t bytes = static_cast<size_t>(shape.num_elements()) * size;
  if (bytes < kStaggerFrom || size == 0) return ctx->allocate_temp(type, shape, out);
  Tensor block;
  const int64_t room = static_cast<int64_t>(bytes + kStaggerPage);
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({room}), &block));
  const unsigned long n = staggered_count.fetch_add(1, std::memory_order_relaxed);
  const size_t wanted = (n * kStaggerStep % (kStaggerPage / kStaggerLine)) * kStaggerLine;
  const auto start = reinterpret_cast<uintptr_t>(block.tensor_data().data());
  const auto skip = static_cast<int64_t>((wanted + kStaggerPage - start % kStaggerPage) % kStaggerPage);
  return out->BitcastFrom(block.Slice(skip, skip + static_cast<int64_t>(bytes)), type, shape);
}

}  // namespace

// Outputs allocated staggered in this process (the tests read it).
extern "C" long stitchfleet_bridge_staggered(void) { return static_cast<long>(staggered_count.load()); }
