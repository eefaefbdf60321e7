"""The C++ text of the native bridge: one TF op per cluster that runs either its stitched code or TF's own ops.

Input: none (a constant). Output: `SOURCE`, the op library's source, compiled by `bridge_op`
against the installed TensorFlow's headers; with `-DGOOGLE_CUDA=1` (a CUDA build of TF) it also
holds the GPU kernel (`bridge_gpu_source`).

`StitchfleetDispatch` is one op for both devices: the same inputs (the step's switch vector, then
the cluster's inputs), outputs and shared attributes (`Tin`, `Tout`, `index`, `fallback`,
`output_shapes`, `passthrough`, `symbol`: the cluster's key for the counters). Each kernel reads
its own attributes, the other's keep their empty defaults:
- CPU (`library`): when `switches[index]` is on it allocates the outputs with TF's allocator
  (64-byte aligned, no copies), aliases passed-through outputs to their inputs and calls
  `int entry(void *const *buffers)` from the cluster's shared object (inputs then outputs, as the C
  generator lays them out). When the switch is off, or the entry returns non-zero (1: no scratch
  memory, 2: a computed output holds NaN/Inf), it runs `fallback`, a function of the graph holding
  the cluster's TF ops, and returns its values: the step never carries a value TF would not have
  computed. A NaN/Inf that TF's own ops do not produce is the kernel's fault and is counted as
  such; one TF produces too is the model's (the loss check deals with it).
- GPU (`module`, `kernels`, `layout`, `scratch_bytes`, `launcher`): the cluster's cubin launched
  through the launch library on TF's compute stream for the op, outputs and per-launch scratch from
  TF's allocator, the fallback on the same GPU; NaN/Inf sets a device flag read at decision steps
  (no sync per step). See `bridge_gpu_source`.

Shape-specialised kernels (a shape signature -> kernel map, planned by another issue) fit the same
op without a new interface: the per-shape attributes become lists indexed alike (`signatures`: one
shape signature per entry, and per entry its `library`/`symbol` or `module`/`kernels`/`layout`/
`scratch_bytes`, with `output_shapes` partial); each kernel picks the entry whose signature its
inputs' shapes match, and a signature without an entry runs `fallback` (TF's ops) for that step
while the plugin compiles one on first sight, bounded by its cache. Until then each attribute holds
the one static-shape kernel.

Why one op instead of `tf.cond(switch, stitched, TF ops)`: a TF1 cond adds a Switch per input
and branch, a Merge and an Identity per output and propagates dead tensors through the branch not
taken; measured on the demo model that is ~500 extra nodes and +9% on every step, stitched or not.

Calls, non-zero statuses, faults and GPU non-finite flags are counted per symbol in the op library
(`stitchfleet_bridge_count`), so the plugin reads them without a Python round trip per call.
"""

from __future__ import annotations

from stitchfleet.plugin.bridge_gpu_source import INCLUDES, KERNEL, REGISTRATION

SOURCE = (
    r"""
#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
"""
    + INCLUDES
    + r"""
namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::AttrSlice;
using tensorflow::DataType;
using tensorflow::FunctionLibraryRuntime;
using tensorflow::NameAttrList;
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

enum { kCalls = 0, kFailed = 1, kFaulted = 2 };

struct Counters {
  std::atomic<long> value[3] = {{0}, {0}, {0}};
  std::vector<volatile int *> flags;  // the GPU kernels' non-finite flags (mapped host memory), under counters_lock
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

void add_flag(Counters *counters, int *flag) {
  std::lock_guard<std::mutex> hold(counters_lock);
  counters->flags.push_back(flag);
}

long flags_set(Counters *counters) {
  std::lock_guard<std::mutex> hold(counters_lock);
  long set = 0;
  for (volatile int *flag : counters->flags) set += *flag != 0;
  return set;
}

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

// What the CPU and GPU kernels share: the attributes, the switch and the fallback function.
class DispatchBase : public AsyncOpKernel {
 public:
  explicit DispatchBase(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    std::string symbol;
    std::vector<PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("symbol", &symbol));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("passthrough", &passthrough_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("index", &index_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fallback", &fallback_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &types_));
    OP_REQUIRES(ctx, passthrough_.size() == shapes.size() && types_.size() == shapes.size(),
                InvalidArgument("passthrough has ", passthrough_.size(), " entries and Tout ", types_.size(),
                                " for ", shapes.size(), " outputs"));
    for (const PartialTensorShape &shape : shapes) {
      TensorShape full;
      OP_REQUIRES(ctx, shape.AsTensorShape(&full),
                  InvalidArgument("output shape ", shape.DebugString(), " is not fully defined"));
      shapes_.push_back(full);
    }
    counters_ = counters_for(symbol);
  }

 protected:
  bool SwitchedOn(OpKernelContext *ctx, Status *status) const {
    const Tensor &switches = ctx->input(0);
    if (switches.dims() != 1) {
      *status = InvalidArgument("switches must be a vector");
      return false;
    }
    return index_ < switches.NumElements() && switches.flat<bool>()(index_);
  }

  Status Handle(OpKernelContext *ctx, FunctionLibraryRuntime **lib, FunctionLibraryRuntime::Handle *handle) {
    *lib = ctx->function_library();
    if (*lib == nullptr) return Internal("no function library to run ", fallback_.name());
    std::lock_guard<std::mutex> hold(handles_lock_);
    auto found = handles_.find(*lib);
    if (found != handles_.end()) {
      *handle = found->second;
      return tensorflow::OkStatus();
    }
    TF_RETURN_IF_ERROR((*lib)->Instantiate(fallback_.name(), AttrSlice(&fallback_.attr()), handle));
    handles_[*lib] = *handle;
    return tensorflow::OkStatus();
  }

  struct Pending {
    FunctionLibraryRuntime::Options options;
    std::vector<Tensor> args, rets, ours;
  };

  // The cluster's TF ops on this op's device (the device's function library places them there).
  // `ours` (host tensors only) are the stitched values to judge against TF's.
  void RunFallback(OpKernelContext *ctx, std::vector<Tensor> ours, DoneCallback done) {
    FunctionLibraryRuntime *lib = nullptr;
    FunctionLibraryRuntime::Handle handle;
    OP_REQUIRES_OK_ASYNC(ctx, Handle(ctx, &lib, &handle), done);
    auto *pending = new Pending();
    pending->ours = std::move(ours);
    FunctionLibraryRuntime::Options &options = pending->options;
    options.rendezvous = ctx->rendezvous();
    options.cancellation_manager = ctx->cancellation_manager();
    options.collective_executor = ctx->collective_executor();
    options.step_container = ctx->step_container();
    options.runner = ctx->runner();
    options.run_all_kernels_inline = ctx->run_all_kernels_inline();
    for (int i = 1; i < ctx->num_inputs(); ++i) pending->args.push_back(ctx->input(i));
    Counters *counters = counters_;
    lib->Run(options, handle, pending->args, &pending->rets,
             [ctx, pending, counters, done = std::move(done)](const Status &status) {
               if (!status.ok()) {
                 ctx->SetStatus(status);
               } else if (pending->rets.size() != static_cast<size_t>(ctx->num_outputs())) {
                 ctx->SetStatus(Internal("the fallback returned ", pending->rets.size(), " values for ",
                                         ctx->num_outputs(), " outputs"));
               } else {
                 if (!pending->ours.empty() && kernel_at_fault(pending->ours, pending->rets)) {
                   counters->value[kFaulted].fetch_add(1, std::memory_order_relaxed);
                   faults_total.fetch_add(1, std::memory_order_relaxed);
                 }
                 for (size_t j = 0; j < pending->rets.size(); ++j)
                   ctx->set_output(static_cast<int>(j), pending->rets[j]);
               }
               delete pending;
               done();
             });
  }

  std::vector<TensorShape> shapes_;
  std::vector<int> passthrough_;
  tensorflow::DataTypeVector types_;
  int index_ = 0;
  NameAttrList fallback_;
  Counters *counters_ = nullptr;
  std::mutex handles_lock_;
  std::map<FunctionLibraryRuntime *, FunctionLibraryRuntime::Handle> handles_;
};

class StitchfleetDispatchOp : public DispatchBase {
 public:
  explicit StitchfleetDispatchOp(OpKernelConstruction *ctx) : DispatchBase(ctx) {
    std::string library, symbol;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("library", &library));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("symbol", &symbol));
    OP_REQUIRES(ctx, !library.empty(), InvalidArgument("the CPU kernel needs the cluster's shared object (library)"));
    void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    OP_REQUIRES(ctx, handle != nullptr, NotFound("cannot load ", library, ": ", dlerror()));
    entry_ = reinterpret_cast<Entry>(dlsym(handle, symbol.c_str()));
    OP_REQUIRES(ctx, entry_ != nullptr, NotFound("no symbol ", symbol, " in ", library));
  }

  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    Status status;
    const bool on = SwitchedOn(ctx, &status);
    OP_REQUIRES_OK_ASYNC(ctx, status, done);
    std::vector<Tensor> ours;
    if (on) {
      int code = 0;
      OP_REQUIRES_OK_ASYNC(ctx, RunNative(ctx, &ours, &code), done);
      if (code == 0) {
        for (size_t j = 0; j < ours.size(); ++j) ctx->set_output(static_cast<int>(j), ours[j]);
        done();
        return;
      }
      if (code != 2) ours.clear();  // no numbers to judge: the entry did not run to the end
    }
    RunFallback(ctx, std::move(ours), std::move(done));
  }

 private:
  Status RunNative(OpKernelContext *ctx, std::vector<Tensor> *outs, int *code) {
    const int inputs = ctx->num_inputs() - 1;
    std::vector<void *> buffers;
    buffers.reserve(inputs + shapes_.size());
    for (int i = 0; i < inputs; ++i) buffers.push_back(const_cast<char *>(ctx->input(i + 1).tensor_data().data()));
    for (size_t j = 0; j < shapes_.size(); ++j) {
      const int source = passthrough_[j];
      if (source >= 0) {
        if (source >= inputs) return InvalidArgument("passthrough input ", source, " out of range");
        outs->push_back(ctx->input(source + 1));  // the C code leaves these alone
        buffers.push_back(buffers[source]);
        continue;
      }
      Tensor out;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(types_[j], shapes_[j], &out));
      buffers.push_back(const_cast<char *>(out.tensor_data().data()));
      outs->push_back(out);
    }
    *code = entry_(buffers.data());
    counters_->value[kCalls].fetch_add(1, std::memory_order_relaxed);
    if (*code != 0) counters_->value[kFailed].fetch_add(1, std::memory_order_relaxed);
    return tensorflow::OkStatus();
  }

  Entry entry_ = nullptr;
};

"""
    + KERNEL
    + r"""
}  // namespace

REGISTER_OP("StitchfleetDispatch")
    .Input("switches: bool")
    .Input("args: Tin")
    .Output("outs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("index: int >= 0")
    .Attr("fallback: func")
    .Attr("output_shapes: list(shape)")
    .Attr("passthrough: list(int)")
    .Attr("symbol: string")
    .Attr("library: string = ''")
    .Attr("module: string = ''")
    .Attr("kernels: list(string) = []")
    .Attr("layout: list(int) = []")
    .Attr("scratch_bytes: int = 0")
    .Attr("launcher: string = ''")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      for (size_t j = 0; j < shapes.size(); ++j) {
        tensorflow::shape_inference::ShapeHandle handle;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[j], &handle));
        c->set_output(static_cast<int>(j), handle);
      }
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("StitchfleetDispatch").Device(tensorflow::DEVICE_CPU), StitchfleetDispatchOp);
"""
    + REGISTRATION
    + r"""
// CPU faults, plus GPU kernels whose non-finite flag is set: one cheap read per step for the plugin.
extern "C" long stitchfleet_bridge_faults(void) {
  long set = 0;
  std::lock_guard<std::mutex> hold(counters_lock);
  for (auto &entry : counters())
    for (volatile int *flag : entry.second->flags) set += *flag != 0;
  return faults_total.load() + set;
}

// what: 0 calls of the entry (or launches), 1 calls with a non-zero status (failed launches), 2 NaN/Inf where
// TF's ops were finite (CPU), 3 GPU kernels whose non-finite flag is set (read without a sync)
extern "C" long stitchfleet_bridge_count(const char *symbol, int what) {
  if (what < 0 || what > 3) return -1;
  Counters *counters = counters_for(symbol);
  return what == 3 ? flags_set(counters) : counters->value[what].load();
}
"""
)
