// StitchfleetDispatch's GPU kernel (compiled with -DGOOGLE_CUDA=1 only, as TF's GPU build defines it).
//
// When the switch is on, the kernel takes TF's compute stream for this op (a CUstream), allocates the
// outputs and one scratch buffer per launch with TF's allocator (stream-ordered: freed memory is only
// reused by later work on the same stream), and calls the launch library's `sf_program_run`, which
// launches the cluster's kernels on that stream (cooperatively where they have a grid barrier) and
// returns without waiting. The launch library is the shared object at the `launcher` attribute, opened
// with dlopen once per process; the program (the cubin at `module`, the kernels `kernels`, the `layout`
// spec of `launch_plan`) is loaded on first use in the stream's context (the device TF placed the op
// on, never a fixed ordinal), and freed with the op (module and pinned flag words).
//
// Non-finite values: the stitched kernels note a NaN/Inf they store into an output in the program's flag
// word 0 (mapped host memory, no extra pass or launch). The plugin's per-step read (collect_gpu_flags, no
// sync) turns a note into a judged next call: the kernels run, then TF's ops on the same inputs, then the
// blame kernels, which set word 1 only where ours is NaN/Inf and TF's finite; that call returns TF's
// values. So an fp16 loss-scaling overflow or a -inf mask, non-finite in TF's ops too, is never a fault.
//
// Anything unusable (no launcher, no driver, a module or occupancy failure, a launch error) is counted as
// failed, logged once, and from then on the cluster's TF ops run on this GPU (the fallback function).
#pragma once

#include "dispatch_base.h"

#if GOOGLE_CUDA
#include <fstream>
#include <sstream>

#include "xla/stream_executor/stream.h"

namespace {
typedef int (*sf_init_t)(void);
typedef const char *(*sf_last_error_t)(void);
typedef int (*sf_program_create_t)(const void *, const long long *, long long, const char *const *, void *, void **);
typedef int (*sf_program_run_t)(void *, void *const *, void *const *, unsigned long long, void *);
typedef int *(*sf_program_flags_t)(void *);
typedef int (*sf_program_blame_t)(void *, void *const *, void *const *, void *);
typedef void (*sf_program_destroy_t)(void *);

// The launch library, opened once per path; `error` says why it is unusable.
struct Launcher {
  std::string error;
  sf_last_error_t last_error = nullptr;
  sf_program_create_t create = nullptr;
  sf_program_run_t run = nullptr;
  sf_program_flags_t flags = nullptr;
  sf_program_blame_t blame = nullptr;
  sf_program_destroy_t destroy = nullptr;
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
  slot->flags = reinterpret_cast<sf_program_flags_t>(dlsym(handle, "sf_program_flags"));
  slot->blame = reinterpret_cast<sf_program_blame_t>(dlsym(handle, "sf_program_blame"));
  slot->destroy = reinterpret_cast<sf_program_destroy_t>(dlsym(handle, "sf_program_destroy"));
  if (!init || !slot->last_error || !slot->create || !slot->run || !slot->flags || !slot->blame || !slot->destroy) {
    slot->error = path + " is not a stitchfleet launch library (a symbol is missing)";
  } else if (init() != 0) {
    slot->error = slot->last_error();
  }
  return slot.get();
}

// The device pointers of `tensors` (TF's device tensors), in order.
std::vector<void *> data_of(const std::vector<Tensor> &tensors) {
  std::vector<void *> pointers;
  for (const Tensor &tensor : tensors) pointers.push_back(const_cast<char *>(tensor.tensor_data().data()));
  return pointers;
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

  // The program's module and pinned flag words go with the op (a graph's ops are destroyed with its session).
  ~StitchfleetGpuDispatchOp() override {
    if (flags_.words != nullptr) remove_gpu(counters_, &flags_);
    if (program_ != nullptr) launcher_->destroy(program_);
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
        if (flags_.judge.exchange(false, std::memory_order_acq_rel)) {  // a NaN/Inf was noted: weigh it
          RunFallback(ctx, std::move(outs), std::move(done),
                      [this](OpKernelContext *c, const std::vector<Tensor> &ours, const std::vector<Tensor> &theirs) {
                        Blame(c, ours, theirs);
                        return false;  // the blame kernels set the flag word; collect_gpu_flags counts it
                      });
          return;
        }
        for (size_t j = 0; j < outs.size(); ++j) ctx->set_output(static_cast<int>(j), outs[j]);
        done();
        return;
      }
      counters_->value[kFailed].fetch_add(1, std::memory_order_relaxed);
      Unusable(launched.ToString());
    }
    RunFallback(ctx, {}, std::move(done));
  }

 private:
  void Unusable(const std::string &why) {
    if (usable_.exchange(false)) LOG(WARNING) << "stitchfleet: GPU kernel unusable, TF's ops run instead: " << why;
  }

  // On the op's stream after TF's ops: the blame kernels over the checked outputs (a launch error is logged;
  // the call's values are TF's either way).
  void Blame(OpKernelContext *ctx, const std::vector<Tensor> &ours, const std::vector<Tensor> &theirs) {
    auto *device_context = ctx->op_device_context();
    if (device_context == nullptr || device_context->stream() == nullptr) return;
    void *stream = device_context->stream()->platform_specific_handle().stream;
    std::vector<void *> mine = data_of(ours), tf = data_of(theirs);
    if (launcher_->blame(program_, mine.data(), tf.data(), stream) != 0)
      LOG(WARNING) << "stitchfleet: judging a GPU kernel's non-finite output failed: " << launcher_->last_error();
  }

  Status Prepare(void *stream) {
    std::lock_guard<std::mutex> hold(load_lock_);
    if (program_ != nullptr) return tensorflow::OkStatus();
    std::vector<const char *> names;
    for (const std::string &name : names_) names.push_back(name.c_str());
    const long long *spec = reinterpret_cast<const long long *>(layout_.data());
    void *program = nullptr;
    if (launcher_->create(image_.data(), spec, static_cast<long long>(layout_.size()), names.data(), stream,
                          &program) != 0)
      return Internal("loading the cluster's kernels: ", launcher_->last_error());
    flags_.words = launcher_->flags(program);
    add_gpu(counters_, &flags_);
    program_ = program;
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
      const int repeat = repeats_[j];  // checked at construction: an earlier output the kernels store
      Tensor tensor = source >= 0 ? ctx->input(source + 1) : Tensor();
      if (repeat >= 0 && !tensor.CopyFrom((*outs)[repeat], shapes_[j]))
        return InvalidArgument("output ", j, " cannot share output ", repeat, "'s buffer");
      if (source < 0 && repeat < 0) TF_RETURN_IF_ERROR(ctx->allocate_temp(types_[j], shapes_[j], &tensor));
      out.push_back(const_cast<char *>(tensor.tensor_data().data()));
      outs->push_back(tensor);
    }
    Tensor scratch;  // per launch: two steps in flight never share a counter or a partial
    unsigned long long scratch_at = 0;
    if (scratch_bytes_ > 0) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_UINT8, TensorShape({scratch_bytes_}), &scratch));
      scratch_at = reinterpret_cast<unsigned long long>(scratch.tensor_data().data());
    }
    if (launcher_->run(program_, in.data(), out.data(), scratch_at, stream) != 0)
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
  GpuFlags flags_;
  std::atomic<bool> usable_{true};
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("StitchfleetDispatch").Device(tensorflow::DEVICE_GPU).HostMemory("switches"),
                        StitchfleetGpuDispatchOp);
#endif  // GOOGLE_CUDA
