// The dispatch op's fallback function: the cluster's TF ops, a FunctionDef of the session's library named by the
// op's `fallback` string. A `func` attribute made TF optimize, copy and place every fallback at each executor build
// (the demo's twin, 12 clusters: its first step 0.56-0.76 s against 0.10-0.18 s by name, docs/plugin/native.md); a
// string is followed by nothing in TF.
//
// What the op runs is still the body a `func` attribute gave it: grappler's meta optimizer over a graph that
// reaches the function (here one node of `StitchfleetFallbackRef`, which never runs), with the session's config,
// devices and CPU device for constant folding, as the session ran it on every function its graph reached. So its
// values stay bit for bit those of the user's graph, which grappler rewrites alike (`x / c` is `x * (1 / c)` in
// both). Optimized once per process, session config and device set, at the first call that needs it; instantiated
// from a library of that body and the functions it reaches (`InstantiateOptions::lib_def`), on the op's own device
// and runtime. On the CPU, oneDNN's layout pass then runs over the body as the session ran it over the user's graph.
#pragma once

#include "common.h"
#include "tensorflow/core/common_runtime/device_mgr.h"
#include "tensorflow/core/common_runtime/device_set.h"
#include "tensorflow/core/common_runtime/function_body.h"
#include "tensorflow/core/common_runtime/function_def_utils.h"
#include "tensorflow/core/common_runtime/graph_constructor.h"
#include "tensorflow/core/framework/graph_to_functiondef.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/grappler/clusters/virtual_cluster.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/meta_optimizer.h"
#include "tensorflow/core/lib/strings/proto_serialization.h"
#include "tensorflow/core/util/util.h"

namespace tensorflow {
// oneDNN's layout pass, as mkl_layout_pass.h declares it under TF's own INTEL_MKL build. Weak: a TF built without
// oneDNN (not on x86) has no such symbol, and the op must still load there.
extern bool RunMklLayoutRewritePass(std::unique_ptr<Graph> *g) __attribute__((weak));
}  // namespace tensorflow

namespace {

using tensorflow::FunctionDef;
using tensorflow::FunctionLibraryDefinition;

const char kFallbackRef[] = "StitchfleetFallbackRef";

// The library of `raw` and the functions its body reaches (self-contained, as `InstantiateOptions::lib_def` must be),
// each as grappler optimizes a function its graph reaches (graph_execution_state.cc: RunMetaOptimizer over the
// session's graph, whose function loop optimizes each reachable function with the same config and cluster).
Status grappler_library(FunctionLibraryRuntime *lib, const FunctionDef &raw,
                        const tensorflow::FunctionDefLibrary &functions, const tensorflow::ConfigProto &config,
                        tensorflow::FunctionDefLibrary *out) {
  tensorflow::grappler::GrapplerItem item;
  item.id = "tf_graph";
  tensorflow::NodeDef *ref = item.graph.add_node();
  ref->set_name("stitchfleet_fallback_ref");
  ref->set_op(kFallbackRef);
  (*ref->mutable_attr())["f"].mutable_func()->set_name(raw.signature().name());
  *item.graph.mutable_library() = functions;
  // The body's ops on the op's device, as the session's placer put them before grappler ran on the user's graph:
  // rewrites that check the device (ArithmeticOptimizer's `Pow(x, 3)` as `x * Square(x)`, on the CPU only) then
  // happen here as they did there. Unplaced, BERT's GELU ran libm's pow per element switched off: 5x its TF ops,
  // other roundings (benchmarks/README.md, session 33).
  if (lib->device() != nullptr) {
    for (FunctionDef &function : *item.graph.mutable_library()->mutable_function()) {
      if (function.signature().name() != raw.signature().name()) continue;
      for (tensorflow::NodeDef &node : *function.mutable_node_def())
        if (node.device().empty()) node.set_device(lib->device()->name());
    }
  }
  item.graph.mutable_versions()->set_producer(lib->graph_def_version());
  item.fetch.push_back(ref->name());
  tensorflow::DeviceSet devices;
  tensorflow::Device *cpu = nullptr;  // the device grappler's constant folding runs on, as the session picks it
  if (lib->device_mgr() != nullptr) {
    for (tensorflow::Device *device : lib->device_mgr()->ListDevices()) {
      devices.AddDevice(device);
      if (cpu == nullptr && device->parsed_name().id == 0 && device->parsed_name().type == "CPU" &&
          device->GetAllocator(tensorflow::AllocatorAttributes()) != nullptr)
        cpu = device;
    }
  }
  tensorflow::grappler::VirtualCluster cluster(&devices);
  tensorflow::GraphDef optimized;
  TF_RETURN_IF_ERROR(tensorflow::grappler::RunMetaOptimizer(std::move(item), config, cpu, &cluster, &optimized));
  for (const FunctionDef &function : optimized.library().function()) {
    if (function.signature().name() == raw.signature().name()) {
      *out = optimized.library();
      return tensorflow::OkStatus();
    }
  }
  return NotFound("grappler's library has no ", raw.signature().name());
}

// oneDNN's rewrites of the body `name` in `functions` (`_MklSoftmax`, `_MklNativeFusedMatMul`, ...), on the CPU with
// oneDNN on (TF_ENABLE_ONEDNN_OPTS), as the session's graph got them after partitioning: a function the op's runtime
// instantiates gets grappler's rewrites but not this pass. Without it BERT's bodies switched off ran Eigen's Softmax
// (2.17 ms a step) where the user's graph ran `_MklSoftmax` (1.14 ms), rounding otherwise (benchmarks/README.md,
// session 33). A body with control outputs is left as it is (the conversion back keeps data outputs only).
Status onednn_body(FunctionLibraryRuntime *lib, const std::string &name, tensorflow::FunctionDefLibrary *functions) {
  if (tensorflow::RunMklLayoutRewritePass == nullptr || !tensorflow::IsMKLEnabled()) return tensorflow::OkStatus();
  if (lib->device() == nullptr || lib->device()->device_type() != tensorflow::DEVICE_CPU) return tensorflow::OkStatus();
  const FunctionLibraryDefinition definitions(tensorflow::OpRegistry::Global(), *functions);
  for (FunctionDef &body : *functions->mutable_function()) {
    if (body.signature().name() != name) continue;
    if (body.control_ret_size() > 0) return tensorflow::OkStatus();
    std::unique_ptr<tensorflow::FunctionBody> instantiated;
    TF_RETURN_IF_ERROR(tensorflow::FunctionDefToBodyHelper(body, tensorflow::AttrSlice(), &definitions, &instantiated));
    auto graph = std::make_unique<tensorflow::Graph>(&definitions);
    tensorflow::CopyGraph(*instantiated->graph, graph.get());
    if (!tensorflow::RunMklLayoutRewritePass(&graph)) return tensorflow::OkStatus();  // nothing oneDNN runs
    std::vector<std::string> outputs;
    for (const tensorflow::OpDef::ArgDef &arg : body.signature().output_arg()) outputs.push_back(arg.name());
    FunctionDef rewritten;
    TF_RETURN_IF_ERROR(tensorflow::GraphToFunctionDef(*graph, name, outputs, &rewritten));
    *rewritten.mutable_attr() = body.attr();
    *rewritten.mutable_arg_attr() = body.arg_attr();
    body = std::move(rewritten);
    return tensorflow::OkStatus();
  }
  return NotFound("the fallback library has no ", name);
}

// The library `name` instantiates from (its optimized body): built once per name, session config and device set,
// then kept for the process (the handles of every runtime that instantiated it refer to it).
Status fallback_library(FunctionLibraryRuntime *lib, const std::string &name, const FunctionLibraryDefinition **out) {
  const FunctionLibraryDefinition *session = lib->GetFunctionLibraryDefinition();
  const FunctionDef *raw = session->Find(name);
  if (raw == nullptr) return NotFound("the fallback function ", name, " is not in the session's function library");
  const tensorflow::ConfigProto no_config;
  const tensorflow::ConfigProto *config = lib->config_proto() != nullptr ? lib->config_proto() : &no_config;
  std::string settings;  // deterministic: a map's entries (device_count) came in another order in another session
  if (!tensorflow::SerializeToStringDeterministic(*config, &settings)) settings = config->ShortDebugString();
  std::string key = name + "\n" + settings;
  if (lib->device_mgr() != nullptr)
    for (tensorflow::Device *device : lib->device_mgr()->ListDevices()) key += "\n" + device->name();
  static std::mutex lock;
  static std::map<std::string, std::unique_ptr<FunctionLibraryDefinition>> built;
  std::lock_guard<std::mutex> hold(lock);
  std::unique_ptr<FunctionLibraryDefinition> &slot = built[key];
  if (!slot) {
    FunctionLibraryDefinition reachable = session->ReachableDefinitions(*raw);
    if (reachable.Find(name) == nullptr) TF_RETURN_IF_ERROR(reachable.AddFunctionDef(*raw));
    tensorflow::FunctionDefLibrary functions = reachable.ToProto();
    if (tensorflow::grappler::MetaOptimizerEnabled(*config)) {
      tensorflow::FunctionDefLibrary optimized;
      const Status status = grappler_library(lib, *raw, functions, *config, &optimized);
      // as the session does when grappler fails: the functions as written
      if (status.ok()) functions = std::move(optimized);
      if (!status.ok()) LOG(WARNING) << "stitchfleet: optimizing " << name << " failed: " << status;
    }
    tensorflow::FunctionDefLibrary onednn = functions;
    const Status rewritten = onednn_body(lib, name, &onednn);
    if (rewritten.ok()) functions = std::move(onednn);  // else grappler's body, as TF's own ops run it
    if (!rewritten.ok()) LOG(WARNING) << "stitchfleet: oneDNN's rewrite of " << name << " failed: " << rewritten;
    slot.reset(new FunctionLibraryDefinition(tensorflow::OpRegistry::Global(), functions));
  }
  *out = slot.get();
  return tensorflow::OkStatus();
}

}  // namespace

// Never runs: in the graph grappler optimizes for a fallback, it reaches the function as the dispatch op's `func`
// attribute once did.
REGISTER_OP("StitchfleetFallbackRef").Attr("f: func").SetIsStateful().SetShapeFn([](auto *) {
  return tensorflow::OkStatus();
});
