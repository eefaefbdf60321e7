"""The C++ text of the native bridge: one TF op per cluster that runs either its stitched code or TF's own ops.

Input: none (a constant). Output: `SOURCE`, the op library's source, compiled by `bridge_op`
against the installed TensorFlow's headers; with `-DGOOGLE_CUDA=1` (a CUDA build of TF) it also
holds the GPU kernel (`bridge_gpu_source`).

`StitchfleetDispatch` is one op for both devices: the same inputs (the step's switch vector, then
the cluster's inputs), outputs and shared attributes (`Tin`, `Tout`, `index`, `fallback`,
`output_shapes`, `passthrough`, `symbol`: the cluster's key for the counters; `input_shapes`, the shape
signature the kernel was built for, and `static_shapes`, the graph's own output shapes, partial where a
dimension is unknown). A call switched on whose inputs do not have the signature's shapes runs
`fallback` (TF's ops) and is counted as a miss: a kernel built for a job's usual batch never sees a
last partial batch. Each kernel reads
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

Shape signatures: `input_shapes` holds the shapes the attributes' kernel reads, `static_shapes` the
graph's partial ones (TF's shape inference downstream stays the user's graph's). Kernels compiled for
other signatures while the job runs are bound beside it (`bridge_binding_source`); a call whose shapes
no kernel has runs `fallback`, counted per symbol (`missed`).

Why one op instead of `tf.cond(switch, stitched, TF ops)`: a TF1 cond adds a Switch per input
and branch, a Merge and an Identity per output and propagates dead tensors through the branch not
taken; measured on the demo model that is ~500 extra nodes and +9% on every step, stitched or not.

Calls, non-zero statuses, faults and GPU non-finite flags are counted per symbol in the op library
(`stitchfleet_bridge_count`), so the plugin reads them without a Python round trip per call.
"""

from __future__ import annotations

from stitchfleet.plugin.bridge_binding_source import BIND_EXPORT, BINDING
from stitchfleet.plugin.bridge_fault_source import COUNT_EXPORTS, FAULTS
from stitchfleet.plugin.bridge_gpu_source import INCLUDES, KERNEL, REGISTRATION

SOURCE = (
    r"""
#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
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

enum { kCalls = 0, kFailed = 1, kFaulted = 2, kMissed = 3 };

struct Counters {
  std::atomic<long> value[4] = {{0}, {0}, {0}, {0}};
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

"""
    + BINDING
    + r"""
"""
    + FAULTS
    + r"""
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
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_shapes", &signature_));
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
    symbol_ = symbol;
  }

 protected:
  // Switched on, and the inputs have the shapes of the op's own kernel (the GPU kernel: it binds no other).
  bool SwitchedOn(OpKernelContext *ctx, Status *status) const {
    const bool on = Switch(ctx, status);
    if (on && !Matches(ctx, signature_)) {
      Missed();
      return false;  // another shape than the kernel was built for: TF's ops compute this call
    }
    return on;
  }

  // Whether `switches[index]` is on (any shapes).
  bool Switch(OpKernelContext *ctx, Status *status) const {
    const Tensor &switches = ctx->input(0);
    if (switches.dims() != 1) {
      *status = InvalidArgument("switches must be a vector");
      return false;
    }
    return index_ < switches.NumElements() && switches.flat<bool>()(index_);
  }

  void Missed() const { counters_->value[kMissed].fetch_add(1, std::memory_order_relaxed); }

  // Whether the inputs have the shapes the kernel was built for (`input_shapes`; empty: not checked).
  static bool Matches(OpKernelContext *ctx, const std::vector<PartialTensorShape> &signature) {
    if (signature.empty()) return true;
    if (static_cast<int>(signature.size()) != ctx->num_inputs() - 1) return false;
    for (size_t i = 0; i < signature.size(); ++i) {
      const PartialTensorShape &want = signature[i];
      const TensorShape &got = ctx->input(static_cast<int>(i) + 1).shape();
      if (want.dims() < 0) continue;  // an input the kernel does not read (batch norm's unused statistics)
      if (want.dims() != got.dims()) return false;
      for (int d = 0; d < got.dims(); ++d)
        if (want.dim_size(d) >= 0 && want.dim_size(d) != got.dim_size(d)) return false;
    }
    return true;
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
  std::vector<PartialTensorShape> signature_;
  std::string symbol_;
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
    slot_ = slot_for(symbol);  // once: the step's path then reads its table without a lock
    std::lock_guard<std::mutex> hold(bindings_lock);
    base_calls_ = key_counter(slot_, "");
  }

  void ComputeAsync(OpKernelContext *ctx, DoneCallback done) override {
    Status status;
    const bool on = Switch(ctx, &status);
    OP_REQUIRES_OK_ASYNC(ctx, status, done);
    std::vector<Tensor> ours;
    const Table *table = on ? slot_->table.load(std::memory_order_acquire) : nullptr;  // one read per call
    Entry entry = nullptr;
    const std::vector<TensorShape> *shapes = nullptr;
    std::atomic<long> *calls = nullptr;
    if (table != nullptr) {
      for (const Binding *kernel : table->kernels) {  // the kernels bound for the signatures the job feeds
        if (kernel->shapes.size() == shapes_.size() && Matches(ctx, kernel->signature)) {
          entry = kernel->entry;
          shapes = &kernel->shapes;
          calls = kernel->calls;
          break;
        }
      }
    }
    if (on && entry == nullptr && (table == nullptr || !table->base_off) && Matches(ctx, signature_)) {
      entry = entry_;  // the kernel of the op's own attributes, built at begin
      shapes = &shapes_;
      calls = base_calls_;
    }
    if (on && entry == nullptr) Missed();  // no kernel for these shapes: TF's ops compute this call
    if (entry != nullptr) {
      int code = 0;
      OP_REQUIRES_OK_ASYNC(ctx, RunNative(ctx, &ours, &code, entry, *shapes), done);
      calls->fetch_add(1, std::memory_order_relaxed);
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
  Status RunNative(OpKernelContext *ctx, std::vector<Tensor> *outs, int *code, Entry entry,
                   const std::vector<TensorShape> &shapes) {
    const int inputs = ctx->num_inputs() - 1;
    std::vector<void *> buffers;
    buffers.reserve(inputs + shapes.size());
    for (int i = 0; i < inputs; ++i) buffers.push_back(const_cast<char *>(ctx->input(i + 1).tensor_data().data()));
    for (size_t j = 0; j < shapes.size(); ++j) {
      const int source = passthrough_[j];
      if (source >= 0) {
        if (source >= inputs) return InvalidArgument("passthrough input ", source, " out of range");
        outs->push_back(ctx->input(source + 1));  // the C code leaves these alone
        buffers.push_back(buffers[source]);
        continue;
      }
      Tensor out;
      TF_RETURN_IF_ERROR(ctx->allocate_temp(types_[j], shapes[j], &out));
      buffers.push_back(const_cast<char *>(out.tensor_data().data()));
      outs->push_back(out);
    }
    *code = entry(buffers.data());
    counters_->value[kCalls].fetch_add(1, std::memory_order_relaxed);
    if (*code != 0) counters_->value[kFailed].fetch_add(1, std::memory_order_relaxed);
    return tensorflow::OkStatus();
  }

  Entry entry_ = nullptr;
  Slot *slot_ = nullptr;
  std::atomic<long> *base_calls_ = nullptr;
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
    .Attr("input_shapes: list(shape) = []")
    .Attr("static_shapes: list(shape) = []")
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
      // The graph's own shapes when given (partial where the graph says None): the kernel's shapes hold for
      // calls that match `input_shapes` only, and the other calls run TF's ops, whatever shapes they have.
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("static_shapes", &shapes));
      if (shapes.empty()) TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
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
"""
    + BIND_EXPORT
    + r"""
"""
    + COUNT_EXPORTS
)
