"""The C++ text that tells a stitched kernel's NaN/Inf from TF's own (the CPU op's fault count).

Input: none (a constant). Output: `FAULTS` (`blames_kernel`, `kernel_at_fault`), spliced into
`bridge_source.SOURCE` inside the op library's anonymous namespace.

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
