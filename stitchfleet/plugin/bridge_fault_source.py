"""The C++ text that tells a stitched kernel's NaN/Inf from TF's own (the CPU op's fault count).

Input: none (constants). Output: `FAULTS` (`blames_kernel`, `kernel_at_fault`), spliced into
`bridge_source.SOURCE` inside the op library's anonymous namespace, and `COUNT_EXPORTS`, the C entry
points the plugin reads the counters with (`stitchfleet_bridge_faults`, `stitchfleet_bridge_count`).

Why: a non-finite stitched output is the kernel's fault only where TF's own ops, run as the
fallback on the same inputs, computed a finite value; one that TF produces too is the model's (the
loss check deals with it). Only the CPU op compares (its tensors are on the host).
"""

from __future__ import annotations

FAULTS = r"""
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

"""

COUNT_EXPORTS = r"""
// CPU faults, plus GPU kernels whose non-finite flag is set: one cheap read per step for the plugin.
extern "C" long stitchfleet_bridge_faults(void) {
  long set = 0;
  std::lock_guard<std::mutex> hold(counters_lock);
  for (auto &entry : counters())
    for (volatile int *flag : entry.second->flags) set += *flag != 0;
  return faults_total.load() + set;
}

// what: 0 calls of the entry (or launches), 1 calls with a non-zero status (failed launches), 2 NaN/Inf where
// TF's ops were finite (CPU), 3 GPU kernels whose non-finite flag is set (read without a sync), 4 calls switched
// on whose input shapes missed the kernel's signature (TF's ops ran)
extern "C" long stitchfleet_bridge_count(const char *symbol, int what) {
  if (what < 0 || what > 4) return -1;
  Counters *counters = counters_for(symbol);
  if (what == 4) return counters->value[kMissed].load();
  return what == 3 ? flags_set(counters) : counters->value[what].load();
}
"""
