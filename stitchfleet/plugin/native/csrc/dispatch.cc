// The StitchfleetDispatch op library: one TF op per stitched cluster that runs either its stitched code
// or TF's own ops. Built by dispatch_op.py against the installed TensorFlow's headers; with
// -DGOOGLE_CUDA=1 (a CUDA build of TF) it also holds the GPU kernel (gpu_dispatch.h).
//
// One op for both devices: the same inputs (the step's switch vector, then the cluster's inputs),
// outputs and shared attributes (`Tin`, `Tout`, `index`, `fallback`: the name of the cluster's TF ops as a function
// of the graph's library, a string that TF's optimizers never follow, `output_shapes`, `passthrough`,
// `repeats`: per output, the earlier output whose value it holds, stored once; `symbol`: the cluster's key
// for the counters; `input_shapes`, the shape signature the kernel was built for; `static_shapes`, the graph's own
// output shapes, partial where a dimension is unknown). A call switched on whose inputs do not have the signature's
// shapes runs `fallback` (TF's ops) and is counted as a miss. Each kernel reads its own attributes, the other's keep
// their empty defaults:
// - CPU (`library`): when `switches[index]` is on it allocates the outputs (no copies; a large one at its
//   own offset within its pages: staggered.h), aliases passed-through outputs to their inputs and repeated
//   outputs to the output they repeat (the same buffer, their own shape), and calls
//   `int entry(void *const *buffers)` from the cluster's shared object (inputs then outputs), or its `_pooled` twin
//   with a runner over the device's intra-op worker threads (pool.h) where the object has one. When the switch is off,
//   or the entry returns non-zero (1: no scratch memory, 2: a computed output holds NaN/Inf), it runs `fallback` and
//   returns its values; a NaN/Inf that TF's own ops do not produce is counted as the kernel's fault.
// - GPU (`module`, `kernels`, `layout`, `scratch_bytes`, `launcher`): gpu_dispatch.h.
//
// Why one op instead of `tf.cond(switch, stitched, TF ops)`: a TF1 cond adds a Switch per input and
// branch, a Merge and an Identity per output and propagates dead tensors through the branch not taken;
// measured on the demo model that is ~500 extra nodes and +9% on every step, stitched or not.
#include "binding.h"
#include "common.h"
#include "dispatch_base.h"
#include "fallback.h"
#include "faults.h"
#include "gpu_dispatch.h"  // the GPU kernel: empty unless GOOGLE_CUDA
#include "pool.h"
#include "staggered.h"

namespace {

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
    pooled_ = pooled_beside(handle, symbol);
    slot_ = slot_for(symbol);  // once: the step's path then reads its table without a lock
    // A cluster's TF ops are small elementwise and reduction kernels: handing each to the inter-op pool
    // cost most of the off path (the twin with every cluster off +13-25% CPU time over the user's graph
    // against +4.5-9.6% inline, 3 alternated pairs on the loaded 2-core machine; benchmarks/README.md,
    // "perf (session 11)"). Their own intra-op parallelism is unchanged.
    inline_fallback_ = true;
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
    Pooled pooled = nullptr;
    const std::vector<TensorShape> *shapes = nullptr;
    std::atomic<long> *calls = nullptr;
    if (table != nullptr) {
      for (const Binding *kernel : table->kernels) {  // the kernels bound for the signatures the job feeds
        if (kernel->shapes.size() == shapes_.size() && Matches(ctx, kernel->signature)) {
          entry = kernel->entry;
          pooled = kernel->pooled;
          shapes = &kernel->shapes;
          calls = kernel->calls;
          break;
        }
      }
    }
    if (on && entry == nullptr && (table == nullptr || !table->base_off) && Matches(ctx, signature_)) {
      entry = entry_;  // the kernel of the op's own attributes, built at begin
      pooled = pooled_;
      shapes = &shapes_;
      calls = base_calls_;
    }
    if (on && entry == nullptr) Missed();  // no kernel for these shapes: TF's ops compute this call
    if (entry != nullptr) {
      int code = 0;
      OP_REQUIRES_OK_ASYNC(ctx, RunNative(ctx, &ours, &code, entry, pooled, *shapes), done);
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
  Status RunNative(OpKernelContext *ctx, std::vector<Tensor> *outs, int *code, Entry entry, Pooled pooled,
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
      const int repeat = repeats_[j];
      if (repeat >= 0) {  // checked at construction: an earlier stored output (the C code leaves this one alone)
        Tensor shared;
        if (!shared.CopyFrom((*outs)[repeat], shapes[j]))
          return InvalidArgument("output ", j, " cannot share output ", repeat, "'s buffer with shape ",
                                 shapes[j].DebugString());
        buffers.push_back(buffers[inputs + repeat]);
        outs->push_back(shared);
        continue;
      }
      Tensor out;
      TF_RETURN_IF_ERROR(AllocateOutput(ctx, types_[j], shapes[j], &out));  // staggered when large: staggered.h
      buffers.push_back(const_cast<char *>(out.tensor_data().data()));
      outs->push_back(out);
    }
    void *pool = pooled != nullptr ? tf_pool(ctx) : nullptr;  // the loops' tasks on TF's intra-op threads
    *code = pool != nullptr ? pooled(buffers.data(), run_on_tf_pool, pool) : entry(buffers.data());
    counters_->value[kCalls].fetch_add(1, std::memory_order_relaxed);
    if (*code != 0) counters_->value[kFailed].fetch_add(1, std::memory_order_relaxed);
    return tensorflow::OkStatus();
  }

  Entry entry_ = nullptr;
  Pooled pooled_ = nullptr;
  Slot *slot_ = nullptr;
  std::atomic<long> *base_calls_ = nullptr;
};

}  // namespace

REGISTER_OP("StitchfleetDispatch")
    .Input("switches: bool")
    .Input("args: Tin")
    .Output("outs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("index: int >= 0")
    .Attr("fallback: string")
    .Attr("output_shapes: list(shape)")
    .Attr("input_shapes: list(shape) = []")
    .Attr("static_shapes: list(shape) = []")
    .Attr("passthrough: list(int)")
    .Attr("repeats: list(int)")
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
