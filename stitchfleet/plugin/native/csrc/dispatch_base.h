// What the CPU and GPU kernels of StitchfleetDispatch share: the attributes, the switch, the shape
// signature check and the fallback function (the cluster's TF ops on the op's own device).
#pragma once

#include "common.h"
#include "fallback.h"
#include "faults.h"

namespace {

class DispatchBase : public AsyncOpKernel {
 public:
  explicit DispatchBase(OpKernelConstruction *ctx) : AsyncOpKernel(ctx) {
    std::string symbol;
    std::vector<PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("symbol", &symbol));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("passthrough", &passthrough_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("repeats", &repeats_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("index", &index_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("fallback", &fallback_));
    // Looked up now, not at the first call that needs it: a library without it (a runtime that keeps only the
    // functions a graph's `func` attributes reach) fails the executor's build, never a later step.
    const tensorflow::FunctionLibraryDefinition *functions =
        ctx->function_library() != nullptr ? ctx->function_library()->GetFunctionLibraryDefinition() : nullptr;
    OP_REQUIRES(ctx, functions == nullptr || functions->Find(fallback_) != nullptr,
                NotFound("the fallback function ", fallback_, " is not in the session's function library"));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tout", &types_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_shapes", &signature_));
    OP_REQUIRES(ctx, passthrough_.size() == shapes.size() && types_.size() == shapes.size(),
                InvalidArgument("passthrough has ", passthrough_.size(), " entries and Tout ", types_.size(), " for ",
                                shapes.size(), " outputs"));
    OP_REQUIRES(ctx, repeats_.size() == shapes.size(),
                InvalidArgument("repeats has ", repeats_.size(), " entries for ", shapes.size(), " outputs"));
    for (const PartialTensorShape &shape : shapes) {
      TensorShape full;
      OP_REQUIRES(ctx, shape.AsTensorShape(&full),
                  InvalidArgument("output shape ", shape.DebugString(), " is not fully defined"));
      shapes_.push_back(full);
    }
    for (size_t j = 0; j < repeats_.size(); ++j) {
      const int source = repeats_[j];
      if (source < 0) continue;
      // an earlier output the kernel stores, of the same dtype and element count: its bytes are this output's
      OP_REQUIRES(ctx, static_cast<size_t>(source) < j && repeats_[source] < 0 && passthrough_[j] < 0,
                  InvalidArgument("output ", j, " repeats output ", source, ", which is no earlier stored output"));
      OP_REQUIRES(ctx, types_[source] == types_[j] && shapes_[source].num_elements() == shapes_[j].num_elements(),
                  InvalidArgument("output ", j, " repeats output ", source, " of another dtype or element count"));
    }
    counters_ = counters_for(symbol);
    symbol_ = symbol;
  }

 protected:
  // Whether the fallback function's ops run on this op's own thread rather than each handed to the
  // inter-op pool (the CPU kernel sets it: see dispatch.cc).
  bool inline_fallback_ = false;

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
    if (*lib == nullptr) return Internal("no function library to run ", fallback_);
    std::lock_guard<std::mutex> hold(handles_lock_);
    auto found = handles_.find(*lib);
    if (found != handles_.end()) {
      *handle = found->second;
      return tensorflow::OkStatus();
    }
    // By name from the session's library (DirectSession's runtime holds the whole library, reachable or not), the
    // body grappler gives it: fallback.h.
    FunctionLibraryRuntime::InstantiateOptions options;
    TF_RETURN_IF_ERROR(fallback_library(*lib, fallback_, &options.lib_def));
    TF_RETURN_IF_ERROR((*lib)->Instantiate(fallback_, AttrSlice(), options, handle));
    handles_[*lib] = *handle;
    return tensorflow::OkStatus();
  }

  struct Pending {
    FunctionLibraryRuntime::Options options;
    std::vector<Tensor> args, rets, ours;
  };

  // How a call's stitched values are judged against TF's once TF's ops ran on the same inputs: the CPU
  // compares on the host and says whether the kernel is at fault; the GPU enqueues its blame kernels after
  // TF's ops and says no (its flag word tells, read later without a sync).
  typedef std::function<bool(OpKernelContext *, const std::vector<Tensor> &, const std::vector<Tensor> &)> Judge;

  static bool JudgeOnHost(OpKernelContext *, const std::vector<Tensor> &ours, const std::vector<Tensor> &theirs) {
    return kernel_at_fault(ours, theirs);
  }

  // The cluster's TF ops on this op's device (the device's function library places them there), whose
  // values the call returns. `ours`, when not empty, are the stitched values `judge` weighs against TF's.
  void RunFallback(OpKernelContext *ctx, std::vector<Tensor> ours, DoneCallback done, Judge judge = JudgeOnHost) {
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
    // A traced step (RunOptions FULL_TRACE) times the function's own ops beside the dispatch op: what a switched-off
    // cluster's TF ops cost inside it (scripts/profile_step.py); nullptr, and nothing collected, on every other step.
    options.stats_collector = ctx->stats_collector();
    options.runner = ctx->runner();
    options.run_all_kernels_inline = inline_fallback_ || ctx->run_all_kernels_inline();
    for (int i = 1; i < ctx->num_inputs(); ++i) pending->args.push_back(ctx->input(i));
    Counters *counters = counters_;
    lib->Run(options, handle, pending->args, &pending->rets,
             [ctx, pending, counters, judge = std::move(judge), done = std::move(done)](const Status &status) {
               if (!status.ok()) {
                 ctx->SetStatus(status);
               } else if (pending->rets.size() != static_cast<size_t>(ctx->num_outputs())) {
                 ctx->SetStatus(Internal("the fallback returned ", pending->rets.size(), " values for ",
                                         ctx->num_outputs(), " outputs"));
               } else {
                 if (!pending->ours.empty() && judge(ctx, pending->ours, pending->rets)) {
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
  // Per output, the earlier output whose value it holds (the kernel stores it once), or -1: the op hands out
  // that output's buffer with this output's shape (`Tensor::CopyFrom` shares it) instead of allocating one.
  std::vector<int> repeats_;
  tensorflow::DataTypeVector types_;
  int index_ = 0;
  // The name of the cluster's function in the graph's library: a string, not a `func` attribute, so that TF does
  // not optimize, copy and place every fallback at each executor build for calls that seldom need one.
  std::string fallback_;
  Counters *counters_ = nullptr;
  std::mutex handles_lock_;
  std::map<FunctionLibraryRuntime *, FunctionLibraryRuntime::Handle> handles_;
};

}  // namespace
