"""The C++ text of kernels bound while a job runs: `stitchfleet_bridge_bind` and the table the op reads.

Input: none (constants). Output: `BINDING` (inside the op library's anonymous namespace: the
`Binding` table keyed by an op's `symbol`, `bound`, and `parse_shapes` for the shapes' text) and
`BIND_EXPORT` (the C entry point `rebinding` calls through ctypes), spliced into `bridge_source.SOURCE`.

Why: a TF1 graph is finalized before the first feed shows a `None` batch size, so the ops of a
cluster built for a guessed batch cannot get new attributes; they take a kernel compiled for the fed
shapes from this table instead (entry, input signature, output shapes; the op's passthrough and
fallback stay). No lock is taken on the step's path until the first binding.
"""

from __future__ import annotations

BINDING = r"""
// A kernel compiled while the job runs, for the shapes it really feeds (`stitchfleet_bridge_bind`): it
// replaces the attributes' entry, signature and output shapes of every op whose `symbol` it names.
struct Binding {
  Entry entry = nullptr;
  std::vector<PartialTensorShape> signature;
  std::vector<TensorShape> shapes;
};

std::atomic<int> bindings_made{0};  // no lock on the step's path until the first binding
std::mutex bindings_lock;
std::map<std::string, std::shared_ptr<const Binding>> &bindings() {
  static std::map<std::string, std::shared_ptr<const Binding>> table;
  return table;
}

std::shared_ptr<const Binding> bound(const std::string &symbol) {
  if (bindings_made.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard<std::mutex> hold(bindings_lock);
  auto found = bindings().find(symbol);
  return found == bindings().end() ? nullptr : found->second;
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

"""

BIND_EXPORT = r"""
// Binds `entry` of `library` (a cluster compiled for the shapes the job feeds) to every op whose symbol is
// `symbol`: shapes "[in][in]...|[out]..." as parse_shapes reads them; the outputs must be as many as the op's.
// 0 bound, 1 library not loadable, 2 no such entry, 3 malformed shapes.
extern "C" int stitchfleet_bridge_bind(const char *symbol, const char *library, const char *entry, const char *shapes) {
  const std::string text(shapes);
  const size_t bar = text.find('|');
  auto binding = std::make_shared<Binding>();
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
  std::lock_guard<std::mutex> hold(bindings_lock);
  bindings()[symbol] = binding;
  bindings_made.fetch_add(1, std::memory_order_release);
  return 0;
}

"""
