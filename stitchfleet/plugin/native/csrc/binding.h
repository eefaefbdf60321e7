// Kernels bound while a job runs: a small table of kernels per op symbol, keyed by shape signature.
//
// A TF1 graph is finalized before the first feed shows a `None` batch size, so the ops of a cluster
// built at `begin` cannot get new attributes; they take kernels compiled for the shapes the job really
// feeds from this table instead (entry, input signature, output shapes; the op's passthrough and
// fallback stay). The op runs the first kernel whose input signature the call's inputs match, the
// kernel of its own attributes after the bound ones, TF's ops when none matches.
//
// The step's path takes no lock: each op finds its symbol's `Slot` once, at construction, and reads
// the slot's current table with one atomic load per call. A table is never changed in place: binding
// and unbinding (a few times per job) build a new one under `bindings_lock` and publish it; old tables
// and their kernels are kept until the process ends (a call may still be reading one). The plugin
// bounds the kernels per op (STITCHFLEET_SIGNATURES_MAX); `kMaxBound` is only a backstop. A hook
// resets its ops' tables when it starts (`stitchfleet_bridge_reset`): kernels an earlier session bound
// would otherwise run unseen by this job's guard.
#pragma once

#include "common.h"
#include "pool.h"

namespace {

// A kernel compiled while the job runs, for one shape signature the job feeds (`stitchfleet_bridge_bind`).
struct Binding {
  std::string key;  // the job's shape signature, as the plugin names it (calls are counted per key)
  Entry entry = nullptr;
  Pooled pooled = nullptr;  // the same kernel over TF's intra-op threads (pool.h)
  std::vector<PartialTensorShape> signature;
  std::vector<TensorShape> shapes;
  std::atomic<long> *calls = nullptr;  // the slot's counter for `key`
};

// An op symbol's kernels: immutable once published (see the module docstring).
struct Table {
  std::vector<const Binding *> kernels;  // tried in order; at most kMaxBound
  bool base_off = false;                 // the kernel of the op's own attributes is unbound too: its calls run TF's ops
};

constexpr size_t kMaxBound = 64;

struct Slot {
  std::atomic<const Table *> table{nullptr};  // nullptr: nothing bound, the op's own kernel serves
  std::map<std::string, std::unique_ptr<std::atomic<long>>> calls;  // per key ("": the op's own kernel)
  std::vector<std::unique_ptr<const Table>> tables;  // every table published, kept (a call may read an old one)
  std::vector<std::unique_ptr<const Binding>> kept;  // every binding made, kept alike
};

std::mutex bindings_lock;
std::map<std::string, std::unique_ptr<Slot>> &bindings() {
  static std::map<std::string, std::unique_ptr<Slot>> table;
  return table;
}

// The symbol's slot (made on first use; never freed): ops look it up once, at construction.
Slot *slot_for(const std::string &symbol) {
  std::lock_guard<std::mutex> hold(bindings_lock);
  std::unique_ptr<Slot> &slot = bindings()[symbol];
  if (!slot) {
    slot.reset(new Slot());
    slot->calls[""].reset(new std::atomic<long>(0));
  }
  return slot.get();
}

std::atomic<long> *key_counter(Slot *slot, const std::string &key) {  // under bindings_lock
  std::unique_ptr<std::atomic<long>> &counter = slot->calls[key];
  if (!counter) counter.reset(new std::atomic<long>(0));
  return counter.get();
}

// Publishes `table` as the slot's current one (under bindings_lock).
void publish(Slot *slot, Table *table) {
  slot->tables.emplace_back(table);
  slot->table.store(table, std::memory_order_release);
}

// "[8,16][16][-1]" -> shapes (-1: a dimension not checked); false on malformed text.
bool parse_shapes(const std::string &text, std::vector<PartialTensorShape> *out) {
  size_t at = 0;
  while (at < text.size()) {
    if (text[at] != '[') return false;
    const size_t end = text.find(']', at);
    if (end == std::string::npos) return false;
    std::vector<int64_t> dims;
    const std::string inside = text.substr(at + 1, end - at - 1);
    size_t from = 0;
    while (from < inside.size()) {
      const size_t comma = inside.find(',', from);
      const std::string item = inside.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
      char *stop = nullptr;
      const long long value = std::strtoll(item.c_str(), &stop, 10);
      if (item.empty() || *stop != '\0') return false;
      dims.push_back(value);
      from = comma == std::string::npos ? inside.size() : comma + 1;
    }
    PartialTensorShape shape;
    if (!PartialTensorShape::BuildPartialTensorShape(dims, &shape).ok()) return false;
    out->push_back(shape);
    at = end + 1;
  }
  return true;
}

}  // namespace

// The C entry points the plugin calls through ctypes.
// Binds `entry` of `library` (a cluster compiled for the shape signature `key`) to every op whose symbol is
// `symbol`, beside the kernels bound for other keys (a kernel bound for the same key is replaced); shapes
// "[in][in]...|[out]..." as parse_shapes reads them; the outputs must be as many as the op's.
// 0 bound, 1 library not loadable, 2 no such entry, 3 malformed shapes, 4 table full (kMaxBound), 5 empty key.
extern "C" int stitchfleet_bridge_bind(const char *symbol, const char *library, const char *entry, const char *shapes,
                                       const char *key) {
  const std::string text(shapes), name(key);
  if (name.empty()) return 5;  // "" names the op's own kernel
  const size_t bar = text.find('|');
  auto binding = std::unique_ptr<Binding>(new Binding());
  binding->key = name;
  std::vector<PartialTensorShape> outs;
  if (bar == std::string::npos || !parse_shapes(text.substr(0, bar), &binding->signature) ||
      !parse_shapes(text.substr(bar + 1), &outs))
    return 3;
  for (const PartialTensorShape &shape : outs) {
    TensorShape full;
    if (!shape.AsTensorShape(&full)) return 3;
    binding->shapes.push_back(full);
  }
  void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return 1;
  binding->entry = reinterpret_cast<Entry>(dlsym(handle, entry));
  if (binding->entry == nullptr) return 2;
  binding->pooled = pooled_beside(handle, entry);
  Slot *slot = slot_for(symbol);
  std::lock_guard<std::mutex> hold(bindings_lock);
  const Table *current = slot->table.load(std::memory_order_acquire);
  auto *table = new Table();
  if (current != nullptr) {
    table->base_off = current->base_off;
    for (const Binding *kernel : current->kernels)
      if (kernel->key != name) table->kernels.push_back(kernel);
  }
  if (table->kernels.size() >= kMaxBound) {
    delete table;
    return 4;
  }
  binding->calls = key_counter(slot, name);
  table->kernels.push_back(binding.get());
  slot->kept.push_back(std::move(binding));
  publish(slot, table);
  return 0;
}

// Unbinds the kernel of `key` from the ops whose symbol is `symbol` ("": the kernel of the ops' own
// attributes): calls of that signature run TF's ops from now on. 0 unbound, 1 nothing bound for `key`.
extern "C" int stitchfleet_bridge_unbind(const char *symbol, const char *key) {
  const std::string name(key);
  Slot *slot = slot_for(symbol);
  std::lock_guard<std::mutex> hold(bindings_lock);
  const Table *current = slot->table.load(std::memory_order_acquire);
  auto *table = new Table();
  bool found = name.empty() && (current == nullptr || !current->base_off);
  table->base_off = name.empty() || (current != nullptr && current->base_off);
  if (current != nullptr) {
    for (const Binding *kernel : current->kernels) {
      if (kernel->key == name) {
        found = true;
      } else {
        table->kernels.push_back(kernel);
      }
    }
  }
  if (!found) {
    delete table;
    return 1;
  }
  publish(slot, table);
  return 0;
}

// Forgets every kernel bound to `symbol`'s ops and their per-key counts, and binds the ops' own kernel again: a
// job's hook starts from what its graph's ops were built with, not from an earlier session's bindings.
extern "C" void stitchfleet_bridge_reset(const char *symbol) {
  Slot *slot = slot_for(symbol);
  std::lock_guard<std::mutex> hold(bindings_lock);
  slot->table.store(nullptr, std::memory_order_release);  // the old tables stay: a call may still read one
  for (auto &counter : slot->calls) counter.second->store(0);
}

// Calls of `symbol`'s ops that ran the kernel bound for `key` ("": the kernel of the ops' own attributes).
extern "C" long stitchfleet_bridge_signature_count(const char *symbol, const char *key) {
  Slot *slot = slot_for(symbol);
  std::lock_guard<std::mutex> hold(bindings_lock);
  auto found = slot->calls.find(key);
  return found == slot->calls.end() ? 0 : found->second->load();
}
