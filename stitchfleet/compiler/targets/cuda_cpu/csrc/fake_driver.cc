// A fake libcuda.so.1 for CI: the driver API subset the launch library (csrc/launch.c) calls, run on the CPU.
//
// Built by fake_driver.py with the soname libcuda.so.1: once it is loaded in a process, the launch library's
// dlopen("libcuda.so.1") gets it. A module image is not a cubin but "SFCUDACPU1\n<path>": a cuda-cpu shared
// object built from the same module source NVRTC compiles (fake_driver.module_image), whose sf_cu_<name>
// entries take the driver's kernelParams (one pointer per parameter, pointing at its value). Memory is the
// host's: a device pointer is a host address. Launches run at once, on the calling thread.
//
// What it checks that a GPU would punish later (each a CUresult, logged): calls before cuInit, a call that
// needs a current context without one, pops without a push, a launch of more threads than the function's
// __launch_bounds__ or more dynamic shared memory than it was allowed, a cooperative launch larger than the
// device holds at once, a cooperative launch whose barrier counter (its last argument) is not zero, a
// kernel the cuda-cpu runtime aborted (deadlock, debug checks). Faults are sticky, as on a GPU: every later
// call returns the same error until sffake_reset. Every call is recorded (sffake_log); sffake_inject makes
// the n-th next call of a given name fail with a given result, optionally sticky.
//
// The fake keeps books of what a context owns, as a driver does: each cuModuleLoadData loads a private copy
// of the image's shared object, so every module has its own globals (two programs of one cluster each point
// their own `sf_nonfinite_flag`); cuModuleUnload closes it, and a function, global or launch of an unloaded
// module is refused (use after unload). cuModuleGetGlobal reports a global's real size (its ELF symbol);
// cuMemcpyHtoD and the memsets must stay inside memory the fake knows (a module global, a mapped host
// allocation, or device memory the tests declared with sffake_device_memory): a copy wider than its global
// is refused. cuMemHostAlloc/cuMemFreeHost are counted, a free of a pointer never allocated (or freed twice)
// is refused, and sffake_live reports the modules and pinned allocations still held (leaks).
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdarg.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

typedef int (*entry_t)(void **, unsigned, unsigned, size_t, int, int, int, int, char *, size_t);

struct fake_module {
  void *library;
  std::vector<CUdeviceptr> globals;  // regions handed out by cuModuleGetGlobal, dropped at unload
};

struct fake_function {
  entry_t entry;
  fake_module *module;  // null once its module is unloaded
  std::string name;
  int params;        // kernel parameters (a grid-barrier kernel's last is its counter)
  int max_threads;   // __launch_bounds__ or 1024
  int allowed_smem;  // dynamic shared memory the function may use (cuFuncSetAttribute raises it)
};

struct fake_context {
  CUdevice device;
  int retained;
};

struct injection {
  std::string call;
  int countdown;
  CUresult result;
  int sticky;
};

std::mutex mutex;
std::vector<std::string> calls;
std::vector<injection> injections;
fake_context primary = {0, 0};
int initialised = 0;
CUresult sticky = CUDA_SUCCESS;
int sms = 132, major = 9, minor = 0, cooperative = 1;
int occupancy_override = -1;  // blocks per SM, -1: the model in occupancy()
int order = 0, blocks = -1, debug = 1;
long long pushes = 0, pops = 0;
thread_local std::vector<CUcontext> stack;

// What the context owns. Function records are kept after their module's unload (module set to null), so a
// stale handle is recognised and refused rather than run through a closed shared object.
std::set<fake_module *> modules;
std::set<fake_function *> functions;
struct region {
  size_t bytes;
  std::string what;  // "global NAME", "host", "device"
};
std::map<CUdeviceptr, region> regions;        // start -> extent: globals, mapped host memory, declared memory
std::map<void *, unsigned> host_allocations;  // cuMemHostAlloc'd pointer -> its flags
long long host_frees = 0, module_unloads = 0;

void record(const char *format, ...) {
  char line[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::lock_guard<std::mutex> lock(mutex);
  calls.emplace_back(line);
}

// The result the call returns before doing anything: a sticky fault, an injected failure, or success.
CUresult gate(const char *call) {
  std::lock_guard<std::mutex> lock(mutex);
  if (sticky != CUDA_SUCCESS) {
    calls.push_back(std::string("! ") + call + " sticky " + std::to_string((int)sticky));
    return sticky;
  }
  for (size_t i = 0; i < injections.size(); ++i) {
    if (injections[i].call != call || --injections[i].countdown > 0) continue;
    injection hit = injections[i];
    injections.erase(injections.begin() + (long)i);
    if (hit.sticky) sticky = hit.result;
    calls.push_back(std::string("! ") + call + " injected " + std::to_string((int)hit.result));
    return hit.result;
  }
  if (!initialised && std::strcmp(call, "cuInit") != 0) {
    calls.push_back(std::string("! ") + call + " before cuInit");
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  return CUDA_SUCCESS;
}

CUresult fault(const char *call, CUresult result, const char *why) {
  record("! %s %s", call, why);
  std::lock_guard<std::mutex> lock(mutex);
  sticky = result;
  return result;
}

CUresult refuse(const char *call, CUresult result, const char *why) {
  record("! %s %s", call, why);
  return result;
}

// The region holding [pointer, pointer + bytes), or null: the fake's view of "valid device memory".
const region *inside(CUdeviceptr pointer, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex);
  auto next = regions.upper_bound(pointer);
  if (next == regions.begin()) return nullptr;
  --next;
  if (pointer + bytes > next->first + next->second.bytes) return nullptr;
  return &next->second;
}

fake_module *live_module(CUmodule handle) {
  std::lock_guard<std::mutex> lock(mutex);
  fake_module *module = reinterpret_cast<fake_module *>(handle);
  return modules.count(module) ? module : nullptr;
}

// A function handle the fake made whose module is still loaded; why not otherwise.
const char *stale(CUfunction handle) {
  std::lock_guard<std::mutex> lock(mutex);
  fake_function *function = reinterpret_cast<fake_function *>(handle);
  if (function == nullptr) return "null function";
  if (!functions.count(function)) return "not a function handle";
  if (function->module == nullptr) return "function of an unloaded module";
  return nullptr;
}

// Blocks per SM: 2048 threads, 32 blocks and 228 KiB of shared memory (1 KiB reserved per block) per SM, the
// H100/H200 limits; registers are not modelled (the fake reports 32 per thread).
int occupancy(int block, size_t smem) {
  if (occupancy_override >= 0) return occupancy_override;
  int by_threads = 2048 / (block > 0 ? block : 1);
  int by_smem = (int)((228u * 1024u) / (smem + 1024u));
  int held = by_threads < by_smem ? by_threads : by_smem;
  return held < 32 ? held : 32;
}

CUresult launch(const char *call, CUfunction handle, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                unsigned block_x, unsigned block_y, unsigned block_z, unsigned smem, CUstream stream, void **params,
                int is_cooperative) {
  CUresult status = gate(call);
  if (status != CUDA_SUCCESS) return status;
  const char *why = stale(handle);
  fake_function *function = why == nullptr ? reinterpret_cast<fake_function *>(handle) : nullptr;
  record("%s %s grid=%u block=%u smem=%u stream=%p", call, function ? function->name.c_str() : "(stale)", grid_x,
         block_x, smem, (void *)stream);
  if (stack.empty()) return refuse(call, CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (why != nullptr) return refuse(call, CUDA_ERROR_INVALID_HANDLE, why);
  if (grid_y != 1 || grid_z != 1 || block_y != 1 || block_z != 1)
    return refuse(call, CUDA_ERROR_INVALID_VALUE, "cuda-cpu runs one-dimensional launches only");
  if (grid_x < 1 || block_x < 1 || block_x > 1024) return refuse(call, CUDA_ERROR_INVALID_VALUE, "bad launch size");
  if ((int)block_x > function->max_threads)
    return refuse(call, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "more threads than __launch_bounds__");
  if ((int)smem > function->allowed_smem)
    return refuse(call, CUDA_ERROR_INVALID_VALUE, "dynamic shared memory above the function's allowance");
  if (is_cooperative) {
    if (!cooperative) return refuse(call, CUDA_ERROR_NOT_SUPPORTED, "no cooperative launch on this device");
    if ((long long)grid_x > (long long)occupancy((int)block_x, smem) * sms)
      return refuse(call, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "grid larger than the device holds at once");
  }
  if (is_cooperative) {
    if (function->params < 1 || params == nullptr)
      return refuse(call, CUDA_ERROR_INVALID_VALUE, "a cooperative launch of a kernel without a barrier counter");
    const unsigned *counter = *static_cast<unsigned *const *>(params[function->params - 1]);
    if (counter == nullptr || *counter != 0)
      return fault(call, CUDA_ERROR_LAUNCH_FAILED, "barrier counter not zero at a cooperative launch (sticky)");
  }
  char error[1024] = {0};
  int failed = function->entry(params, grid_x, block_x, smem, order, blocks, debug, 0xff, error, sizeof error);
  if (failed) {
    record("! %s kernel %s: %s", call, function->name.c_str(), error);
    return fault(call, CUDA_ERROR_LAUNCH_FAILED, "the kernel was aborted (sticky)");
  }
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int flags) {
  CUresult status = gate("cuInit");
  if (status != CUDA_SUCCESS) return status;
  record("cuInit flags=%u", flags);
  if (flags != 0) return refuse("cuInit", CUDA_ERROR_INVALID_VALUE, "flags must be 0");
  initialised = 1;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  switch (error) {
    case CUDA_SUCCESS:
      *text = "no error";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *text = "invalid argument";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *text = "out of memory";
      break;
    case CUDA_ERROR_NOT_INITIALIZED:
      *text = "initialization error";
      break;
    case CUDA_ERROR_INVALID_IMAGE:
      *text = "device kernel image is invalid";
      break;
    case CUDA_ERROR_INVALID_CONTEXT:
      *text = "invalid device context";
      break;
    case CUDA_ERROR_INVALID_HANDLE:
      *text = "invalid resource handle";
      break;
    case CUDA_ERROR_NOT_FOUND:
      *text = "named symbol not found";
      break;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *text = "an illegal memory access was encountered";
      break;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
      *text = "too many resources requested for launch";
      break;
    case CUDA_ERROR_LAUNCH_FAILED:
      *text = "unspecified launch failure";
      break;
    case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
      *text = "too many blocks in cooperative launch";
      break;
    case CUDA_ERROR_NOT_SUPPORTED:
      *text = "operation not supported";
      break;
    default:
      *text = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  CUresult status = gate("cuDeviceGet");
  if (status != CUDA_SUCCESS) return status;
  record("cuDeviceGet ordinal=%d", ordinal);
  if (ordinal != 0) return refuse("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE, "one device");
  *device = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
  CUresult status = gate("cuDeviceGetAttribute");
  if (status != CUDA_SUCCESS) return status;
  record("cuDeviceGetAttribute attribute=%d", (int)attribute);
  if (device != 0) return refuse("cuDeviceGetAttribute", CUDA_ERROR_INVALID_DEVICE, "one device");
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *value = sms;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
      *value = major;
      break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
      *value = minor;
      break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
      *value = cooperative;
      break;
    default:
      return refuse("cuDeviceGetAttribute", CUDA_ERROR_INVALID_VALUE, "attribute not faked");
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
  CUresult status = gate("cuDevicePrimaryCtxRetain");
  if (status != CUDA_SUCCESS) return status;
  record("cuDevicePrimaryCtxRetain device=%d", (int)device);
  std::lock_guard<std::mutex> lock(mutex);
  primary.retained++;
  *context = reinterpret_cast<CUcontext>(&primary);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  CUresult status = gate("cuDevicePrimaryCtxRelease");
  if (status != CUDA_SUCCESS) return status;
  record("cuDevicePrimaryCtxRelease device=%d", (int)device);
  std::lock_guard<std::mutex> lock(mutex);
  if (primary.retained == 0) return CUDA_ERROR_INVALID_CONTEXT;
  primary.retained--;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device) {
  CUresult status = gate("cuCtxGetDevice");
  if (status != CUDA_SUCCESS) return status;
  record("cuCtxGetDevice");
  if (stack.empty()) return refuse("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  *device = reinterpret_cast<fake_context *>(stack.back())->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext context) {
  CUresult status = gate("cuCtxPushCurrent");
  if (status != CUDA_SUCCESS) return status;
  record("cuCtxPushCurrent depth=%zu", stack.size() + 1);
  if (context != reinterpret_cast<CUcontext>(&primary))
    return refuse("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT, "unknown context");
  stack.push_back(context);
  std::lock_guard<std::mutex> lock(mutex);
  pushes++;
  return CUDA_SUCCESS;
}

// Pops even while a fault is sticky: a real driver does too, and the launch library must stay balanced then.
CUresult cuCtxPopCurrent(CUcontext *context) {
  record("cuCtxPopCurrent depth=%zu", stack.size());
  if (stack.empty()) return refuse("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT, "pop without a push");
  if (context != nullptr) *context = stack.back();
  stack.pop_back();
  std::lock_guard<std::mutex> lock(mutex);
  pops++;
  return CUDA_SUCCESS;
}

// Streams are the host's: every stream belongs to the primary context (one device, one context).
CUresult cuStreamGetCtx(CUstream stream, CUcontext *context) {
  CUresult status = gate("cuStreamGetCtx");
  if (status != CUDA_SUCCESS) return status;
  record("cuStreamGetCtx stream=%p", (void *)stream);
  *context = reinterpret_cast<CUcontext>(&primary);
  return CUDA_SUCCESS;
}

// Each load gets a private copy of the shared object (dlopen of one path twice shares its globals), unlinked
// once open: the module's globals are its own, and closing it at unload frees them.
CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  CUresult status = gate("cuModuleLoadData");
  if (status != CUDA_SUCCESS) return status;
  record("cuModuleLoadData");
  if (stack.empty()) return refuse("cuModuleLoadData", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  const char *text = static_cast<const char *>(image);
  const char magic[] = "SFCUDACPU1\n";
  if (text == nullptr || std::strncmp(text, magic, sizeof magic - 1) != 0)
    return refuse("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, "not a cuda-cpu image");
  FILE *source = std::fopen(text + sizeof magic - 1, "rb");
  if (source == nullptr) return refuse("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, "the image's file is missing");
  const char *tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/sffake-module-XXXXXX";
  int fd = mkstemp(&path[0]);
  bool copied = fd >= 0;
  char chunk[1 << 16];
  for (size_t n; copied && (n = std::fread(chunk, 1, sizeof chunk, source)) > 0;)
    copied = write(fd, chunk, n) == (ssize_t)n;
  std::fclose(source);
  if (fd >= 0) close(fd);
  void *library = copied ? dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  std::string error = library == nullptr ? (copied ? dlerror() : "cannot copy the image") : "";
  if (fd >= 0) unlink(path.c_str());
  if (library == nullptr) return refuse("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, error.c_str());
  fake_module *loaded = new fake_module{library, {}};
  std::lock_guard<std::mutex> lock(mutex);
  modules.insert(loaded);
  *module = reinterpret_cast<CUmodule>(loaded);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule handle) {
  CUresult status = gate("cuModuleUnload");
  if (status != CUDA_SUCCESS) return status;
  record("cuModuleUnload");
  if (stack.empty()) return refuse("cuModuleUnload", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  fake_module *module = live_module(handle);
  if (module == nullptr) return refuse("cuModuleUnload", CUDA_ERROR_INVALID_HANDLE, "not a loaded module");
  {
    std::lock_guard<std::mutex> lock(mutex);
    modules.erase(module);
    for (fake_function *function : functions)
      if (function->module == module) function->module = nullptr;
    for (CUdeviceptr global : module->globals) regions.erase(global);
    module_unloads++;
  }
  dlclose(module->library);
  delete module;
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule handle, const char *name) {
  CUresult status = gate("cuModuleGetFunction");
  if (status != CUDA_SUCCESS) return status;
  record("cuModuleGetFunction %s", name);
  fake_module *module = live_module(handle);
  if (module == nullptr) return refuse("cuModuleGetFunction", CUDA_ERROR_INVALID_HANDLE, "not a loaded module");
  void *library = module->library;
  std::string symbol = std::string("sf_cu_") + name, bounds = std::string("sf_bounds_") + name;
  std::string arity = std::string("sf_params_") + name;
  entry_t entry = reinterpret_cast<entry_t>(dlsym(library, symbol.c_str()));
  const int *max_threads = static_cast<const int *>(dlsym(library, bounds.c_str()));
  const int *count = static_cast<const int *>(dlsym(library, arity.c_str()));
  if (entry == nullptr || max_threads == nullptr || count == nullptr)
    return refuse("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND, name);
  fake_function *made = new fake_function{entry, module, name, *count, *max_threads, 48 * 1024};
  std::lock_guard<std::mutex> lock(mutex);
  functions.insert(made);
  *function = reinterpret_cast<CUfunction>(made);
  return CUDA_SUCCESS;
}

// A `__device__` variable of the module: its address and its size as the ELF symbol gives it (a kernel or an
// unknown name is NOT_FOUND, as for a cubin). The region is valid for cuMemcpyHtoD until the module's unload.
CUresult cuModuleGetGlobal(CUdeviceptr *pointer, size_t *bytes, CUmodule handle, const char *name) {
  CUresult status = gate("cuModuleGetGlobal");
  if (status != CUDA_SUCCESS) return status;
  record("cuModuleGetGlobal %s", name);
  if (stack.empty()) return refuse("cuModuleGetGlobal", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  fake_module *module = live_module(handle);
  if (module == nullptr) return refuse("cuModuleGetGlobal", CUDA_ERROR_INVALID_HANDLE, "not a loaded module");
  if (name == nullptr) return refuse("cuModuleGetGlobal", CUDA_ERROR_INVALID_VALUE, "null name");
  void *address = dlsym(module->library, name);
  Dl_info info;
  void *found = nullptr;
  if (address == nullptr || dladdr1(address, &info, &found, RTLD_DL_SYMENT) == 0) found = nullptr;
  const ElfW(Sym) *entry = static_cast<const ElfW(Sym) *>(found);
  if (entry == nullptr || ELF64_ST_TYPE(entry->st_info) != STT_OBJECT)
    return refuse("cuModuleGetGlobal", CUDA_ERROR_NOT_FOUND, name);
  const CUdeviceptr start = reinterpret_cast<CUdeviceptr>(address);
  {
    std::lock_guard<std::mutex> lock(mutex);
    regions[start] = region{(size_t)entry->st_size, std::string("global ") + name};
    module->globals.push_back(start);
  }
  if (pointer != nullptr) *pointer = start;
  if (bytes != nullptr) *bytes = (size_t)entry->st_size;
  return CUDA_SUCCESS;
}

// Synchronous, like the driver's: the destination range must lie inside one region the fake knows (a copy
// wider than a module global, or into memory never allocated, is INVALID_VALUE rather than silent damage).
CUresult cuMemcpyHtoD(CUdeviceptr destination, const void *source, size_t bytes) {
  CUresult status = gate("cuMemcpyHtoD");
  if (status != CUDA_SUCCESS) return status;
  record("cuMemcpyHtoD ptr=%#llx bytes=%zu", (unsigned long long)destination, bytes);
  if (stack.empty()) return refuse("cuMemcpyHtoD", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (source == nullptr || destination == 0) return refuse("cuMemcpyHtoD", CUDA_ERROR_INVALID_VALUE, "null pointer");
  if (inside(destination, bytes) == nullptr)
    return refuse("cuMemcpyHtoD", CUDA_ERROR_INVALID_VALUE, "copy outside any allocation or global");
  std::memcpy(reinterpret_cast<void *>(destination), source, bytes);
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute, CUfunction handle) {
  CUresult status = gate("cuFuncGetAttribute");
  if (status != CUDA_SUCCESS) return status;
  record("cuFuncGetAttribute attribute=%d", (int)attribute);
  if (const char *why = stale(handle)) return refuse("cuFuncGetAttribute", CUDA_ERROR_INVALID_HANDLE, why);
  fake_function *function = reinterpret_cast<fake_function *>(handle);
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *value = 32;
      break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
      *value = 0;
      break;
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *value = function->max_threads;
      break;
    default:
      return refuse("cuFuncGetAttribute", CUDA_ERROR_INVALID_VALUE, "attribute not faked");
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction handle, CUfunction_attribute attribute, int value) {
  CUresult status = gate("cuFuncSetAttribute");
  if (status != CUDA_SUCCESS) return status;
  record("cuFuncSetAttribute attribute=%d value=%d", (int)attribute, value);
  if (const char *why = stale(handle)) return refuse("cuFuncSetAttribute", CUDA_ERROR_INVALID_HANDLE, why);
  fake_function *function = reinterpret_cast<fake_function *>(handle);
  if (attribute != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES || value < 0 || value > 227 * 1024)
    return refuse("cuFuncSetAttribute", CUDA_ERROR_INVALID_VALUE, "only MAX_DYNAMIC_SHARED_SIZE_BYTES up to 227 KiB");
  function->allowed_smem = value;
  return CUDA_SUCCESS;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks_per_sm, CUfunction handle, int block, size_t smem) {
  CUresult status = gate("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  if (status != CUDA_SUCCESS) return status;
  record("cuOccupancyMaxActiveBlocksPerMultiprocessor block=%d smem=%zu", block, smem);
  if (stack.empty()) return refuse("cuOccupancy", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (const char *why = stale(handle)) return refuse("cuOccupancy", CUDA_ERROR_INVALID_HANDLE, why);
  *blocks_per_sm = occupancy(block, smem);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr pointer, unsigned char value, size_t count, CUstream stream) {
  CUresult status = gate("cuMemsetD8Async");
  if (status != CUDA_SUCCESS) return status;
  record("cuMemsetD8Async ptr=%#llx value=%u bytes=%zu stream=%p", (unsigned long long)pointer, value, count,
         (void *)stream);
  if (stack.empty()) return refuse("cuMemsetD8Async", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (pointer == 0) return refuse("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE, "null pointer");
  if (inside(pointer, count) == nullptr)
    return refuse("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE, "range outside any allocation");
  std::memset(reinterpret_cast<void *>(pointer), value, count);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr pointer, unsigned int value, size_t count, CUstream stream) {
  CUresult status = gate("cuMemsetD32Async");
  if (status != CUDA_SUCCESS) return status;
  record("cuMemsetD32Async ptr=%#llx value=%u words=%zu stream=%p", (unsigned long long)pointer, value, count,
         (void *)stream);
  if (stack.empty()) return refuse("cuMemsetD32Async", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (pointer == 0 || pointer % 4) return refuse("cuMemsetD32Async", CUDA_ERROR_INVALID_VALUE, "bad pointer");
  if (inside(pointer, 4 * count) == nullptr)
    return refuse("cuMemsetD32Async", CUDA_ERROR_INVALID_VALUE, "range outside any allocation");
  unsigned int *words = reinterpret_cast<unsigned int *>(pointer);
  for (size_t i = 0; i < count; ++i) words[i] = value;
  return CUDA_SUCCESS;
}

// Pinned host memory, counted in the books; with DEVICEMAP it is also device memory (the same address).
CUresult cuMemHostAlloc(void **host, size_t bytes, unsigned int flags) {
  CUresult status = gate("cuMemHostAlloc");
  if (status != CUDA_SUCCESS) return status;
  record("cuMemHostAlloc bytes=%zu flags=%u", bytes, flags);
  if (stack.empty()) return refuse("cuMemHostAlloc", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (host == nullptr || bytes == 0) return refuse("cuMemHostAlloc", CUDA_ERROR_INVALID_VALUE, "no bytes");
  if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED))
    return refuse("cuMemHostAlloc", CUDA_ERROR_INVALID_VALUE, "unknown flags");
  *host = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*host == nullptr) return refuse("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY, "host allocation failed");
  std::memset(*host, 0xff, bytes);  // pinned memory starts as garbage too
  std::lock_guard<std::mutex> lock(mutex);
  host_allocations[*host] = flags;
  if (flags & CU_MEMHOSTALLOC_DEVICEMAP) regions[reinterpret_cast<CUdeviceptr>(*host)] = region{bytes, "host"};
  return CUDA_SUCCESS;
}

// Only memory allocated with DEVICEMAP has a device address (else INVALID_VALUE, as the driver says).
CUresult cuMemHostGetDevicePointer(CUdeviceptr *device, void *host, unsigned int flags) {
  CUresult status = gate("cuMemHostGetDevicePointer");
  if (status != CUDA_SUCCESS) return status;
  record("cuMemHostGetDevicePointer flags=%u", flags);
  if (stack.empty()) return refuse("cuMemHostGetDevicePointer", CUDA_ERROR_INVALID_CONTEXT, "no current context");
  if (flags != 0) return refuse("cuMemHostGetDevicePointer", CUDA_ERROR_INVALID_VALUE, "flags must be 0");
  const region *mapped = inside(reinterpret_cast<CUdeviceptr>(host), 1);
  if (mapped == nullptr || mapped->what != "host")
    return refuse("cuMemHostGetDevicePointer", CUDA_ERROR_INVALID_VALUE, "not mapped host memory");
  *device = reinterpret_cast<CUdeviceptr>(host);
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *host) {
  CUresult status = gate("cuMemFreeHost");
  if (status != CUDA_SUCCESS) return status;
  record("cuMemFreeHost");
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto found = host_allocations.find(host);
    if (found == host_allocations.end()) {
      calls.push_back("! cuMemFreeHost a pointer cuMemHostAlloc never returned (or freed twice)");
      return CUDA_ERROR_INVALID_VALUE;
    }
    host_allocations.erase(found);
    regions.erase(reinterpret_cast<CUdeviceptr>(host));
    host_frees++;
  }
  std::free(host);
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                        unsigned int block_x, unsigned int block_y, unsigned int block_z, unsigned int smem,
                        CUstream stream, void **params, void **extra) {
  if (extra != nullptr) return refuse("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE, "extra is not faked");
  return launch("cuLaunchKernel", function, grid_x, grid_y, grid_z, block_x, block_y, block_z, smem, stream, params, 0);
}

// The barrier counter is the last argument of every grid-barrier kernel (csrc/launch.c): a GPU would run a
// launch whose counter is not zero into a broken barrier, the fake refuses it.
CUresult cuLaunchCooperativeKernel(CUfunction function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                   unsigned int block_x, unsigned int block_y, unsigned int block_z, unsigned int smem,
                                   CUstream stream, void **params) {
  return launch("cuLaunchCooperativeKernel", function, grid_x, grid_y, grid_z, block_x, block_y, block_z, smem, stream,
                params, 1);
}

// ---- control from the tests (not driver API) ----

void sffake_reset(void) {
  std::lock_guard<std::mutex> lock(mutex);
  calls.clear();
  injections.clear();
  sticky = CUDA_SUCCESS;
  occupancy_override = -1;
  pushes = pops = 0;
}

void sffake_inject(const char *call, int nth, int result, int is_sticky) {
  std::lock_guard<std::mutex> lock(mutex);
  injections.push_back(injection{call, nth, (CUresult)result, is_sticky});
}

void sffake_device(int sm_count, int cc_major, int cc_minor, int can_cooperate) {
  sms = sm_count;
  major = cc_major;
  minor = cc_minor;
  cooperative = can_cooperate;
}

void sffake_schedule(int fiber_order, int block_order, int checks) {
  order = fiber_order;
  blocks = block_order;
  debug = checks;
}

void sffake_occupancy(int blocks_per_sm) { occupancy_override = blocks_per_sm; }

// The log since the last reset, one call a line; returns the bytes it needs (call again with more room).
size_t sffake_log(char *buffer, size_t size) {
  std::lock_guard<std::mutex> lock(mutex);
  std::string text;
  for (const std::string &line : calls) text += line + "\n";
  if (buffer != nullptr && size > 0) {
    size_t n = text.size() < size - 1 ? text.size() : size - 1;
    std::memcpy(buffer, text.data(), n);
    buffer[n] = 0;
  }
  return text.size() + 1;
}

// Device memory the caller allocated itself (TF's allocator, the tests' buffers): memsets and copies may touch it.
void sffake_device_memory(unsigned long long pointer, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex);
  regions[(CUdeviceptr)pointer] = region{bytes, "device"};
}

void sffake_forget_device_memory(void) {
  std::lock_guard<std::mutex> lock(mutex);
  for (auto at = regions.begin(); at != regions.end();) at = at->second.what == "device" ? regions.erase(at) : ++at;
}

// The books (not cleared by sffake_reset): modules loaded and not unloaded, pinned allocations not freed, and
// how many unloads and frees there were in all.
void sffake_live(long long *loaded, long long *pinned, long long *unloads, long long *frees) {
  std::lock_guard<std::mutex> lock(mutex);
  *loaded = (long long)modules.size();
  *pinned = (long long)host_allocations.size();
  *unloads = module_unloads;
  *frees = host_frees;
}

long long sffake_pushes(void) { return pushes; }
long long sffake_pops(void) { return pops; }
int sffake_depth(void) { return (int)stack.size(); }
int sffake_sticky(void) { return (int)sticky; }

}  // extern "C"
