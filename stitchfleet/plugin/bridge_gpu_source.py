"""The C++ text of `StitchfleetDispatch`'s GPU kernel, spliced into `bridge_source.SOURCE`.

Input: none (constants). Output: `INCLUDES`, `KERNEL` (the class, compiled only with `-DGOOGLE_CUDA=1`)
and `REGISTRATION` (its kernel builder). Built by `bridge_op` against the installed TF's headers; what it
needs beyond the framework headers is `xla/stream_executor/stream.h`, which tensorflow-cpu ships
too (identical to the GPU wheel's), so CI compiles it without a GPU wheel or a CUDA toolkit.

When the switch is on, the kernel takes TF's compute stream for this op
(`op_device_context()->stream()->platform_specific_handle().stream`, a CUstream), allocates the
outputs and one scratch buffer per launch with TF's allocator (stream-ordered: freed memory is only
reused by later work on the same stream), and calls the launch library's `sf_program_run`, which
launches the cluster's kernels on that stream (cooperatively where they have a grid barrier) and
returns without waiting. The launch library is the shared object at the `launcher` attribute,
opened with dlopen once per process; the program (the cubin at `module`, the kernels `kernels`, the
`layout` spec of `launch_plan`) is loaded on first use in the stream's context, with each
grid-barrier kernel's co-residency checked. A floating output's NaN/Inf sets a flag in mapped host
memory; `stitchfleet_bridge_count(symbol, 3)` reads it without a sync (at decision steps).
Anything unusable (no launcher, no driver, a module or occupancy failure, a launch error) is
counted as failed, logged once, and from then on the cluster's TF ops run on this GPU (the fallback
function on the device's function library).
"""

from __future__ import annotations

INCLUDES = r"""
#if GOOGLE_CUDA
#include <fstream>
#include <sstream>

#include "xla/stream_executor/stream.h"
#endif
"""

KERNEL = r"""
#if GOOGLE_CUDA
typedef int (*sf_init_t)(void);
typedef const char *(*sf_last_error_t)(void);
typedef int (*sf_program_create_t)(const void *, const long long *, long long, const char *const *, void *, void **);
typedef int (*sf_program_run_t)(void *, void *const *, void *const *, unsigned long long, unsigned long long, void *);
typedef int (*sf_flag_create_t)(void *, int **, unsigned long long *);

// The launch library, opened once per path; `error` says why it is unusable.
struct Launcher {
  std::string error;
  sf_last_error_t last_error = nullptr;
  sf_program_create_t create = nullptr;
  sf_program_run_t run = nullptr;
  sf_flag_create_t flag = nullptr;
};

Launcher *launcher_for(const std::string &path) {
  static std::mutex lock;
  static std::map<std::string, std::unique_ptr<Launcher>> opened;
  std::lock_guard<std::mutex> hold(lock);
  std::unique_ptr<Launcher> &slot = opened[path];
  if (slot) return slot.get();
  slot.reset(new Launcher());
  void *handle = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    slot->error = "cannot load the launch library " + path + ": " + (path.empty() ? "no path" : dlerror());
    return slot.get();
  }
  auto init = reinterpret_cast<sf_init_t>(dlsym(handle, "sf_init"));
  slot->last_error = reinterpret_cast<sf_last_error_t>(dlsym(handle, "sf_last_error"));
  slot->create = reinterpret_cast<sf_program_create_t>(dlsym(handle, "sf_program_create"));
  slot->run = reinterpret_cast<sf_program_run_t>(dlsym(handle, "sf_program_run"));
  slot->flag = reinterpret_cast<sf_flag_create_t>(dlsym(handle, "sf_flag_create"));
  if (!init || !slot->last_error || !slot->create || !slot->run || !slot->flag) {
    slot->error = path + " is not a stitchfleet launch library (a symbol is missing)";
  } else if (init() != 0) {
    slot->error = slot->last_error();
  }
  return slot.get();
}

class StitchfleetGpuDispatchOp : public DispatchBase {
 public:
  explicit StitchfleetGpuDispatchOp(OpKernelConstruction *ctx) : DispatchBase(ctx) {
    std::string module, launcher;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("module", &module));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("kernels", &names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("layout", &layout_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("scratch_bytes", &scratch_bytes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("launcher", &launcher));
    OP_REQUIRES(ctx, layout_.size() > 2 && layout_[2] == static_cast<long long>(shapes_.size()),
                InvalidArgument("layout does not describe ", shapes_.size(), " outputs"));
    std::ifstream file(module, std::ios::binary);
    std::stringstream bytes;
    bytes << file.rdbuf();
    image_ = bytes.str();
    launcher_ = launcher_for(launcher);
    if (image_.empty()) Unusable("cannot read the module " + module);
    if (!launcher_->error.empty()) Unusable(launcher_->error);
  }

  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    Status status;
    const bool on = SwitchedOn(ctx, &status);
    OP_REQUIRES_OK_ASYNC(ctx, status, done);
    if (on && usable_.load()) {
      std::vector<Tensor> outs;
      const Status launched = Launch(ctx, &outs);
      counters_->value[kCalls].fetch_add(1, std::memory_order_relaxed);
      if (launched.ok()) {
        for (size_t j = 0; j < outs.size(); ++j) ctx->set_output(static_cast<int>(j), outs[j]);
        done();
        return;
      }
      counters_->value[kFailed].fetch_add(1, std::memory_order_relaxed);
      Unusable(launched.ToString());
    }
    RunFallback(ctx, {}, std::move(done));  // device tensors: nothing to judge on the host
  }

 private:
  void Unusable(const std::string &why) {
    if (usable_.exchange(false)) LOG(WARNING) << "stitchfleet: GPU kernel unusable, TF's ops run instead: " << why;
  }

  Status Prepare(void *stream) {
    std::lock_guard<std::mutex> hold(load_lock_);
    if (program_ != nullptr) return tensorflow::OkStatus();
    std::vector<const char *> names;
    for (const std::string &name : names_) names.push_back(name.c_str());
    const long long *spec = reinterpret_cast<const long long *>(layout_.data());
    if (launcher_->create(image_.data(), spec, static_cast<long long>(layout_.size()), names.data(), stream,
                          &program_) != 0)
      return Internal("loading the cluster's kernels: ", launcher_->last_error());
    int *host = nullptr;
    if (launcher_->flag(stream, &host, &flag_) != 0) return Internal("a non-finite flag: ", launcher_->last_error());
    add_flag(counters_, host);
    return tensorflow::OkStatus();
  }

  Status Launch(OpKernelContext *ctx, std::vector<Tensor> *outs) {
    auto *device_context = ctx->op_device_context();
    if (device_context == nullptr || device_context->stream() == nullptr) return Internal("no GPU stream for the op");
    void *stream = device_context->stream()->platform_specific_handle().stream;
    TF_RETURN_IF_ERROR(Prepare(stream));
    const int inputs = ctx->num_inputs() - 1;
    std::vector<void *> in, out;
    for (int i = 0; i < inputs; ++i) in.push_back(const_cast<char *>(ctx->input(i + 1).tensor_data().data()));
    for (size_t j = 0; j < shapes_.size(); ++j) {
      const int source = passthrough_[j];
      if (source >= inputs) return InvalidArgument("passthrough input ", source, " out of range");
      Tensor tensor = source >= 0 ? ctx->input(source + 1) : Tensor();
      if (source < 0) TF_RETURN_IF_ERROR(ctx->allocate_temp(types_[j], shapes_[j], &tensor));
      out.push_back(const_cast<char *>(tensor.tensor_data().data()));
      outs->push_back(tensor);
    }
    Tensor scratch;  // per launch: two steps in flight never share a counter or a partial
    unsigned long long scratch_at = 0;
    if (scratch_bytes_ > 0) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({scratch_bytes_}), &scratch));
      scratch_at = reinterpret_cast<unsigned long long>(scratch.tensor_data().data());
    }
    if (launcher_->run(program_, in.data(), out.data(), scratch_at, flag_, stream) != 0)
      return Internal("launching the cluster's kernels: ", launcher_->last_error());
    return tensorflow::OkStatus();
  }

  std::vector<std::string> names_;
  std::vector<int64_t> layout_;
  int64_t scratch_bytes_ = 0;
  std::string image_;
  Launcher *launcher_ = nullptr;
  std::mutex load_lock_;
  void *program_ = nullptr;
  unsigned long long flag_ = 0;
  std::atomic<bool> usable_{true};
};
#endif  // GOOGLE_CUDA
"""

REGISTRATION = r"""
#if GOOGLE_CUDA
REGISTER_KERNEL_BUILDER(Name("StitchfleetDispatch").Device(tensorflow::DEVICE_GPU).HostMemory("switches"),
                        StitchfleetGpuDispatchOp);
#endif
"""
