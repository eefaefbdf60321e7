// What every part of the StitchfleetDispatch op library shares: TF's names, the entry type of a CPU
// cluster's shared object, and the per-symbol counters the plugin reads through ctypes.
//
// The op library is one translation unit (dispatch.cc) that includes these headers once each; a
// header's anonymous namespace is therefore the library's own, and its `extern "C"` functions are
// the library's C entry points.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::AttrSlice;
using tensorflow::DataType;
using tensorflow::FunctionLibraryRuntime;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::Internal;
using tensorflow::errors::InvalidArgument;
using tensorflow::errors::NotFound;

typedef int (*Entry)(void *const *buffers);

enum { kCalls = 0, kFailed = 1, kFaulted = 2, kMissed = 3, kNoted = 4 };

// One GPU op's flag words (mapped host memory its module writes: [0] a stitched kernel stored NaN/Inf into an
// output, [1] a judged call found ours NaN/Inf where TF's value was finite) and whether its next call is judged.
struct GpuFlags {
  int *words = nullptr;
  std::atomic<bool> judge{false};
};

struct Counters {
  std::atomic<long> value[5] = {{0}, {0}, {0}, {0}, {0}};
  std::vector<GpuFlags *> gpu;  // the GPU ops of this symbol alive now, under counters_lock
};

std::atomic<long> faults_total{0};  // every entry's faults: one read per step tells whether to look closer
std::mutex counters_lock;
std::map<std::string, std::unique_ptr<Counters>> &counters() {
  static std::map<std::string, std::unique_ptr<Counters>> table;
  return table;
}

Counters *counters_for(const std::string &symbol) {
  std::lock_guard<std::mutex> hold(counters_lock);
  std::unique_ptr<Counters> &slot = counters()[symbol];
  if (!slot) slot.reset(new Counters());
  return slot.get();
}

void add_gpu(Counters *counters, GpuFlags *flags) {
  std::lock_guard<std::mutex> hold(counters_lock);
  counters->gpu.push_back(flags);
}

void remove_gpu(Counters *counters, GpuFlags *flags) {
  std::lock_guard<std::mutex> hold(counters_lock);
  for (size_t i = 0; i < counters->gpu.size(); ++i) {
    if (counters->gpu[i] == flags) {
      counters->gpu.erase(counters->gpu.begin() + static_cast<long>(i));
      return;
    }
  }
}

// Moves what the GPU ops' flag words say into the counters and resets the words (an atomic exchange: a
// kernel's store is either read now or left for the next read). A blamed call is a fault; a noted NaN/Inf
// makes that op's next call a judged one (TF's ops run on the same inputs beside the stitched kernels).
// Reads host memory only: no stream is synchronised. Under counters_lock.
void collect_gpu_flags() {
  for (auto &entry : counters()) {
    Counters *counters = entry.second.get();
    for (GpuFlags *flags : counters->gpu) {
      if (__atomic_exchange_n(&flags->words[1], 0, __ATOMIC_ACQ_REL) != 0) {
        counters->value[kFaulted].fetch_add(1, std::memory_order_relaxed);
        faults_total.fetch_add(1, std::memory_order_relaxed);
      }
      if (__atomic_exchange_n(&flags->words[0], 0, __ATOMIC_ACQ_REL) != 0) {
        counters->value[kNoted].fetch_add(1, std::memory_order_relaxed);
        flags->judge.store(true, std::memory_order_release);
      }
    }
  }
}

}  // namespace
