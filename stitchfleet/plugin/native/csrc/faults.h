// Tells a stitched kernel's NaN/Inf from TF's own, and the counters' C entry points.
//
// A non-finite stitched output is the kernel's fault only where TF's own ops, run as the fallback on
// the same inputs, computed a finite value; one that TF produces too is the model's (the loss check
// deals with it).
#pragma once

#include "common.h"

namespace {

template <typename T>
bool blames_kernel(const Tensor &ours, const Tensor &theirs) {
  auto a = ours.flat<T>();
  auto b = theirs.flat<T>();
  for (int64_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(static_cast<double>(a(i))) && std::isfinite(static_cast<double>(b(i)))) return true;
  }
  return false;
}

// Whether a stitched output holds NaN/Inf where TF's own ops computed a finite value.
bool kernel_at_fault(const std::vector<Tensor> &ours, const std::vector<Tensor> &theirs) {
  for (size_t j = 0; j < ours.size() && j < theirs.size(); ++j) {
    const Tensor &a = ours[j];
    if (!a.IsInitialized() || a.shape() != theirs[j].shape() || a.dtype() != theirs[j].dtype()) continue;
    switch (a.dtype()) {
      case tensorflow::DT_FLOAT:
        if (blames_kernel<float>(a, theirs[j])) return true;
        break;
      case tensorflow::DT_DOUBLE:
        if (blames_kernel<double>(a, theirs[j])) return true;
        break;
      case tensorflow::DT_HALF:
        if (blames_kernel<Eigen::half>(a, theirs[j])) return true;
        break;
      case tensorflow::DT_BFLOAT16:
        if (blames_kernel<tensorflow::bfloat16>(a, theirs[j])) return true;
        break;
      default:
        break;
    }
  }
  return false;
}

}  // namespace

// Faults of every entry (CPU: NaN/Inf where TF's ops were finite; GPU: judged calls that blamed the kernel),
// after collecting the GPU ops' flag words: one cheap read per step for the plugin (no stream is synchronised).
extern "C" long stitchfleet_bridge_faults(void) {
  std::lock_guard<std::mutex> hold(counters_lock);
  collect_gpu_flags();
  return faults_total.load();
}

// what: 0 calls of the entry (or launches), 1 calls with a non-zero status (failed launches), 2 NaN/Inf where
// TF's ops on the same inputs were finite (CPU: every such call; GPU: judged calls), 3 reads that found a GPU
// kernel had noted NaN/Inf in an output (each makes the op's next call a judged one), 4 calls switched on whose
// input shapes missed the kernel's signature (TF's ops ran)
extern "C" long stitchfleet_bridge_count(const char *symbol, int what) {
  if (what < 0 || what > 4) return -1;
  Counters *counters = counters_for(symbol);
  {
    std::lock_guard<std::mutex> hold(counters_lock);
    collect_gpu_flags();
  }
  if (what == 3) return counters->value[kNoted].load();
  if (what == 4) return counters->value[kMissed].load();
  return counters->value[what].load();
}
