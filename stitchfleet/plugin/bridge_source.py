"""The C++ text of the native bridge: a TF op that calls a compiled cluster's C entry point.

Input: none (a constant). Output: `SOURCE`, the op library's source, compiled by `bridge_op`
against the installed TensorFlow's headers.

`StitchfleetCall` takes the cluster's inputs, allocates its outputs with TF's allocator (64-byte
aligned, no copies), aliases passed-through outputs to their inputs, and calls
`int entry(void *const *buffers)` from the cluster's shared object (inputs then outputs, as the
C generator lays them out). The entry's return code is the op's `status` output (0 ok, 1 scratch
allocation failed, 2 a computed output holds NaN/Inf). Calls and non-zero statuses are counted
per entry symbol in the op library (`stitchfleet_bridge_count`), so the plugin can tell how often
the stitched path ran without a Python round trip per call.
"""

from __future__ import annotations

SOURCE = r"""
#include <dlfcn.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::errors::NotFound;

typedef int (*Entry)(void *const *buffers);

struct Counters {
  std::atomic<long> calls{0};
  std::atomic<long> failed{0};
};

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

class StitchfleetCallOp : public OpKernel {
 public:
  explicit StitchfleetCallOp(OpKernelConstruction *ctx) : OpKernel(ctx) {
    std::string library, symbol;
    std::vector<PartialTensorShape> shapes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("library", &library));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("symbol", &symbol));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &shapes));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("passthrough", &passthrough_));
    OP_REQUIRES(ctx, passthrough_.size() == shapes.size(),
                InvalidArgument("passthrough has ", passthrough_.size(), " entries for ", shapes.size(), " outputs"));
    for (const PartialTensorShape &shape : shapes) {
      TensorShape full;
      OP_REQUIRES(ctx, shape.AsTensorShape(&full),
                  InvalidArgument("output shape ", shape.DebugString(), " is not fully defined"));
      shapes_.push_back(full);
    }
    void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    OP_REQUIRES(ctx, handle != nullptr, NotFound("cannot load ", library, ": ", dlerror()));
    entry_ = reinterpret_cast<Entry>(dlsym(handle, symbol.c_str()));
    OP_REQUIRES(ctx, entry_ != nullptr, NotFound("no symbol ", symbol, " in ", library));
    counters_ = counters_for(symbol);
  }

  void Compute(OpKernelContext *ctx) override {
    const int inputs = ctx->num_inputs();
    std::vector<void *> buffers;
    buffers.reserve(inputs + shapes_.size());
    for (int i = 0; i < inputs; ++i) buffers.push_back(const_cast<char *>(ctx->input(i).tensor_data().data()));
    for (size_t j = 0; j < shapes_.size(); ++j) {
      const int source = passthrough_[j];
      if (source >= 0) {
        OP_REQUIRES(ctx, source < inputs, InvalidArgument("passthrough input ", source, " out of range"));
        ctx->set_output(static_cast<int>(j), ctx->input(source));  // the C code leaves these alone
        buffers.push_back(buffers[source]);
        continue;
      }
      Tensor *out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(j), shapes_[j], &out));
      buffers.push_back(const_cast<char *>(out->tensor_data().data()));
    }
    const int code = entry_(buffers.data());
    counters_->calls.fetch_add(1, std::memory_order_relaxed);
    if (code != 0) counters_->failed.fetch_add(1, std::memory_order_relaxed);
    Tensor *status = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(shapes_.size()), TensorShape({}), &status));
    status->scalar<int>()() = code;
  }

 private:
  std::vector<TensorShape> shapes_;
  std::vector<int> passthrough_;
  Entry entry_ = nullptr;
  Counters *counters_ = nullptr;
};

}  // namespace

REGISTER_OP("StitchfleetCall")
    .Input("args: Tin")
    .Output("outs: Tout")
    .Output("status: int32")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("output_shapes: list(shape)")
    .Attr("passthrough: list(int)")
    .Attr("library: string")
    .Attr("symbol: string")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext *c) {
      std::vector<PartialTensorShape> shapes;
      TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
      for (size_t j = 0; j < shapes.size(); ++j) {
        tensorflow::shape_inference::ShapeHandle handle;
        TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(shapes[j], &handle));
        c->set_output(static_cast<int>(j), handle);
      }
      c->set_output(static_cast<int>(shapes.size()), c->Scalar());
      return tensorflow::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("StitchfleetCall").Device(tensorflow::DEVICE_CPU), StitchfleetCallOp);

extern "C" long stitchfleet_bridge_count(const char *symbol, int failed) {
  Counters *c = counters_for(symbol);
  return failed ? c->failed.load() : c->calls.load();
}
"""
