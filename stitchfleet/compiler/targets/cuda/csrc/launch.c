/* The launch library: load a cubin, check occupancy, launch on a given stream, run a cluster's program.

   C99 against the CUDA driver API's header (cuda.h, from the nvidia-cuda-runtime-cu12 wheel or a toolkit),
   built by launch_library.build. The library opens libcuda.so.1 itself with dlopen at sf_init, so it builds
   and loads on a machine without a GPU driver (CI) and says so there, instead of failing to load. One C ABI
   serves two callers: the TF GPU op (C++, TF's compute stream) and Python via ctypes.

   Why these calls:
   - a kernel with a grid barrier is launched with cuLaunchCooperativeKernel, which guarantees every block is
     resident at once (or fails with COOPERATIVE_LAUNCH_TOO_LARGE): it never hangs when NCCL/Horovod kernels
     or MPS share the GPU, as a plain launch of a full wave can;
   - the barrier counter is zeroed on the launch's own stream right before the launch, so each launch may use
     a fresh scratch allocation and two steps in flight never share a counter;
   - occupancy comes from cuOccupancyMaxActiveBlocksPerMultiprocessor for the compiled function (its real
     registers and shared memory), not from the planner's model.
   Every call returns the CUresult (0: success); sf_last_error names the failed call and the driver's message,
   per thread. */

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __thread char last_error[512];

typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*ctx_get_device_t)(CUdevice *);
typedef CUresult (*device_attribute_t)(int *, CUdevice_attribute, CUdevice);
typedef CUresult (*module_load_t)(CUmodule *, const void *);
typedef CUresult (*module_unload_t)(CUmodule);
typedef CUresult (*module_function_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*function_attribute_t)(int *, CUfunction_attribute, CUfunction);
typedef CUresult (*function_set_attribute_t)(CUfunction, CUfunction_attribute, int);
typedef CUresult (*occupancy_t)(int *, CUfunction, int, size_t);
typedef CUresult (*memset_t)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*launch_t)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, CUstream, void **, void **);
typedef CUresult (*cooperative_t)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, CUstream, void **);
typedef CUresult (*error_string_t)(CUresult, const char **);

static struct {
  void *handle;
  init_t init;
  ctx_get_device_t ctx_get_device;
  device_attribute_t device_attribute;
  module_load_t module_load;
  module_unload_t module_unload;
  module_function_t module_function;
  function_attribute_t function_attribute;
  function_set_attribute_t function_set_attribute;
  occupancy_t occupancy;
  memset_t memset_d32_async;
  launch_t launch;
  cooperative_t cooperative;
  error_string_t error_string;
} cu;

static int fail(const char *call, CUresult status) {
  const char *text = NULL;
  if (cu.error_string == NULL || cu.error_string(status, &text) != CUDA_SUCCESS || text == NULL) text = "unknown";
  snprintf(last_error, sizeof last_error, "%s failed: %s (CUresult %d)", call, text, (int)status);
  return (int)status;
}

#define CALL(expr, name)                                     \
  do {                                                       \
    CUresult status_ = (expr);                               \
    if (status_ != CUDA_SUCCESS) return fail(name, status_); \
  } while (0)
#define NEED(name)                                                                                          \
  do {                                                                                                      \
    if (cu.handle == NULL) {                                                                                \
      snprintf(last_error, sizeof last_error, "%s: the launch library is not initialised (sf_init)", name); \
      return (int)CUDA_ERROR_NOT_INITIALIZED;                                                               \
    }                                                                                                       \
  } while (0)

const char *sf_last_error(void) { return last_error; }

static void *symbol(const char *name, int *missing) {
  void *found = dlsym(cu.handle, name);
  if (found == NULL && *missing == 0) {
    snprintf(last_error, sizeof last_error, "libcuda.so.1 lacks %s (driver too old)", name);
    *missing = 1;
  }
  return found;
}

int sf_init(void) {
  if (cu.handle != NULL) return 0;
  void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == NULL) {
    snprintf(last_error, sizeof last_error, "no CUDA driver: dlopen(libcuda.so.1) failed: %s", dlerror());
    return (int)CUDA_ERROR_NO_DEVICE;
  }
  cu.handle = handle;
  int missing = 0;
  cu.init = (init_t)symbol("cuInit", &missing);
  cu.ctx_get_device = (ctx_get_device_t)symbol("cuCtxGetDevice", &missing);
  cu.device_attribute = (device_attribute_t)symbol("cuDeviceGetAttribute", &missing);
  cu.module_load = (module_load_t)symbol("cuModuleLoadData", &missing);
  cu.module_unload = (module_unload_t)symbol("cuModuleUnload", &missing);
  cu.module_function = (module_function_t)symbol("cuModuleGetFunction", &missing);
  cu.function_attribute = (function_attribute_t)symbol("cuFuncGetAttribute", &missing);
  cu.function_set_attribute = (function_set_attribute_t)symbol("cuFuncSetAttribute", &missing);
  cu.occupancy = (occupancy_t)symbol("cuOccupancyMaxActiveBlocksPerMultiprocessor", &missing);
  cu.memset_d32_async = (memset_t)symbol("cuMemsetD32Async", &missing);
  cu.launch = (launch_t)symbol("cuLaunchKernel", &missing);
  cu.cooperative = (cooperative_t)symbol("cuLaunchCooperativeKernel", &missing);
  cu.error_string = (error_string_t)symbol("cuGetErrorString", &missing);
  if (missing) {
    dlclose(handle);
    memset(&cu, 0, sizeof cu);
    return (int)CUDA_ERROR_NOT_SUPPORTED;
  }
  CALL(cu.init(0), "cuInit");
  return 0;
}

/* The current context's device: SM count, compute capability, cooperative launch support. */
int sf_device_info(int *sms, int *major, int *minor, int *cooperative) {
  NEED("sf_device_info");
  CUdevice device;
  CALL(cu.ctx_get_device(&device), "cuCtxGetDevice");
  CALL(cu.device_attribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "cuDeviceGetAttribute(SMs)");
  CALL(cu.device_attribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "cuDeviceGetAttribute");
  CALL(cu.device_attribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "cuDeviceGetAttribute");
  CALL(cu.device_attribute(cooperative, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, device), "cuDeviceGetAttribute");
  return 0;
}

int sf_module_load(const void *image, CUmodule *module) {
  NEED("sf_module_load");
  CALL(cu.module_load(module, image), "cuModuleLoadData");
  return 0;
}

int sf_module_unload(CUmodule module) {
  NEED("sf_module_unload");
  CALL(cu.module_unload(module), "cuModuleUnload");
  return 0;
}

/* A kernel of a loaded module, with its compiled registers and static shared memory; a kernel
   wanting more than 48 KiB of dynamic shared memory is allowed that much first. */
int sf_function(CUmodule module, const char *name, int dynamic_smem, CUfunction *function, int *registers,
                int *static_smem) {
  NEED("sf_function");
  CALL(cu.module_function(function, module, name), "cuModuleGetFunction");
  CALL(cu.function_attribute(registers, CU_FUNC_ATTRIBUTE_NUM_REGS, *function), "cuFuncGetAttribute(NUM_REGS)");
  CALL(cu.function_attribute(static_smem, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, *function),
       "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
  if (dynamic_smem > 48 * 1024) {
    CALL(cu.function_set_attribute(*function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_smem),
         "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
  }
  return 0;
}

int sf_occupancy(CUfunction function, int block, size_t dynamic_smem, int *blocks_per_sm) {
  NEED("sf_occupancy");
  CALL(cu.occupancy(blocks_per_sm, function, block, dynamic_smem), "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return 0;
}

/* One launch on `stream`. `args` holds one pointer per kernel parameter, in the kernel's order
   (buffers, then the barrier counter when it has one). With a counter (a grid barrier), the
   counter is zeroed on the stream and the launch is cooperative. */
int sf_launch(CUfunction function, unsigned int grid, unsigned int block, unsigned int dynamic_smem, CUstream stream,
              void **args, CUdeviceptr counter) {
  NEED("sf_launch");
  if (counter != 0) {
    CALL(cu.memset_d32_async(counter, 0, 1, stream), "cuMemsetD32Async(barrier counter)");
    CALL(cu.cooperative(function, grid, 1, 1, block, 1, 1, dynamic_smem, stream, args), "cuLaunchCooperativeKernel");
    return 0;
  }
  CALL(cu.launch(function, grid, 1, 1, block, 1, 1, dynamic_smem, stream, args, NULL), "cuLaunchKernel");
  return 0;
}

/* The largest grid whose blocks are all resident at once: what a cooperative launch accepts. */
long long sf_coresident_grid(int blocks_per_sm, int sms) {
  if (blocks_per_sm <= 0 || sms <= 0) return 0;
  return (long long)blocks_per_sm * (long long)sms;
}

/* ---- the program runner: one cluster's kernels launched in order on a stream ----

   A program is what the TF GPU op runs per step: a cubin plus a *spec*, a flat int64 array written by
   launch_plan.LaunchPlan (so Python, C and C++ share one description and nothing is parsed twice):

       [version, inputs, outputs, scratch_bytes, counter_offset (-1: none), kernels,
        per kernel: grid, block, dynamic_smem, barrier, params, params x (kind, value), zeros, zeros x (offset, bytes),
        checks, checks x (output, elements, dtype)]

   A param's kind is 0 (op input `value`), 1 (op output `value`) or 2 (byte offset `value` into the per-launch
   scratch allocation); a kernel with a grid barrier gets the counter at counter_offset as its last argument.
   `zeros` are scratch ranges cleared on the stream before that kernel (cross-block partials, atomically
   combined targets). The checks name the floating outputs (not passed through): the stitched kernels note a
   NaN/Inf they store into one in the module's `sf_nonfinite_flag`, which the program points at word 0 of two
   words of mapped host memory (sf_program_flags); the host reads them when it likes, without synchronising
   the stream. sf_program_blame runs sf_blame_<dtype> over each checked output against TF's values for it and
   sets word 1 where ours is NaN/Inf and TF's finite. sf_spec_check and sf_pack are pure (no driver): CI tests
   them on any machine. */

enum { SF_SPEC_VERSION = 1, SF_HEADER = 6, SF_MAX_PARAMS = 256, SF_ALIGN = 16 };
enum { SF_INPUT = 0, SF_OUTPUT = 1, SF_SCRATCH = 2 };
static const char *const sf_blame_names[4] = {"sf_blame_f32", "sf_blame_f16", "sf_blame_bf16", "sf_blame_f64"};

static int invalid(const char *what, long long at) {
  snprintf(last_error, sizeof last_error, "launch spec: %s (at %lld)", what, at);
  return (int)CUDA_ERROR_INVALID_VALUE;
}

/* Walks the spec; returns 0 when every field is in range, else the reason. The position of kernel
   k's first field is written to starts[k] (room for `room` kernels), the checks' to *checks_at. */
static int walk(const long long *spec, long long length, long long *starts, int room, long long *checks_at) {
  if (spec == NULL || length < SF_HEADER) return invalid("shorter than its header", 0);
  if (spec[0] != SF_SPEC_VERSION) return invalid("unknown version", 0);
  const long long inputs = spec[1], outputs = spec[2], scratch = spec[3], counter = spec[4], kernels = spec[5];
  if (inputs < 0 || outputs < 1 || scratch < 0 || kernels < 1) return invalid("bad header", 1);
  if (counter != -1 && (counter < 0 || counter % 4 || counter + 4 > scratch)) return invalid("bad counter offset", 4);
  long long at = SF_HEADER;
  for (long long k = 0; k < kernels; ++k) {
    if (at + 5 > length) return invalid("truncated kernel", at);
    if (k < room) starts[k] = at;
    const long long grid = spec[at], block = spec[at + 1], smem = spec[at + 2], barrier = spec[at + 3];
    const long long params = spec[at + 4];
    if (grid < 1 || grid > 0x7fffffffLL || block < 1 || block > 1024 || smem < 0) return invalid("bad launch", at);
    if (barrier != 0 && barrier != 1) return invalid("bad barrier flag", at + 3);
    if (barrier && counter == -1) return invalid("a grid barrier without a counter", at + 3);
    if (params < 0 || params + barrier > SF_MAX_PARAMS) return invalid("bad parameter count", at + 4);
    at += 5;
    if (at + 2 * params + 1 > length) return invalid("truncated parameters", at);
    for (long long p = 0; p < params; ++p, at += 2) {
      const long long kind = spec[at], value = spec[at + 1];
      if (kind == SF_INPUT && (value < 0 || value >= inputs)) return invalid("input index out of range", at);
      if (kind == SF_OUTPUT && (value < 0 || value >= outputs)) return invalid("output index out of range", at);
      if (kind == SF_SCRATCH && (value < 0 || value >= scratch || value % SF_ALIGN))
        return invalid("scratch offset out of range or unaligned", at);
      if (kind < SF_INPUT || kind > SF_SCRATCH) return invalid("unknown parameter kind", at);
    }
    const long long zeros = spec[at++];
    if (zeros < 0 || at + 2 * zeros > length) return invalid("bad zero ranges", at - 1);
    for (long long z = 0; z < zeros; ++z, at += 2) {
      if (spec[at] < 0 || spec[at + 1] < 1 || spec[at] + spec[at + 1] > scratch)
        return invalid("zero range outside scratch", at);
    }
  }
  if (at >= length) return invalid("no check count", at);
  *checks_at = at;
  const long long checks = spec[at++];
  if (checks < 0 || at + 3 * checks != length) return invalid("bad checks (or trailing fields)", at - 1);
  for (long long c = 0; c < checks; ++c, at += 3) {
    if (spec[at] < 0 || spec[at] >= outputs || spec[at + 1] < 0 || spec[at + 2] < 0 || spec[at + 2] > 3)
      return invalid("bad check", at);
  }
  return 0;
}

int sf_spec_check(const long long *spec, long long length) {
  long long checks_at = 0;
  return walk(spec, length, NULL, 0, &checks_at);
}

/* Kernel k's argument values (device pointers) in parameter order, then the counter when it has a
   grid barrier; refuses a null or unaligned buffer (as the Python packer does: a kernel's buffers have at
   least one element, kernel/verify.py). *count receives how many values were written. */
int sf_pack(const long long *spec, long long length, int k, void *const *inputs, void *const *outputs,
            unsigned long long scratch, unsigned long long *values, int capacity, int *count) {
  long long starts[SF_MAX_PARAMS], checks_at = 0;
  int status = walk(spec, length, starts, SF_MAX_PARAMS, &checks_at);
  if (status != 0) return status;
  if (k < 0 || k >= spec[5] || k >= SF_MAX_PARAMS) return invalid("no such kernel", k);
  long long at = starts[k];
  const long long barrier = spec[at + 3], params = spec[at + 4];
  if (params + barrier > capacity) return invalid("too little room for the arguments", at + 4);
  at += 5;
  for (long long p = 0; p < params; ++p, at += 2) {
    const long long kind = spec[at], value = spec[at + 1];
    unsigned long long pointer = kind == SF_INPUT    ? (unsigned long long)(size_t)inputs[value]
                                 : kind == SF_OUTPUT ? (unsigned long long)(size_t)outputs[value]
                                                     : scratch + (unsigned long long)value;
    if (kind == SF_SCRATCH && scratch == 0) return invalid("the kernel needs scratch but none was given", at);
    if (pointer == 0) return invalid("a null buffer", at);
    if (pointer % SF_ALIGN) return invalid("a buffer not 16-byte aligned", at);
    values[p] = pointer;
  }
  if (barrier) values[params] = scratch + (unsigned long long)spec[4];
  *count = (int)(params + barrier);
  return 0;
}

typedef CUresult (*stream_ctx_t)(CUstream, CUcontext *);
typedef CUresult (*ctx_push_t)(CUcontext);
typedef CUresult (*ctx_pop_t)(CUcontext *);
typedef CUresult (*memset8_t)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*host_alloc_t)(void **, size_t, unsigned int);
typedef CUresult (*host_device_pointer_t)(CUdeviceptr *, void *, unsigned int);
typedef CUresult (*free_host_t)(void *);
typedef CUresult (*module_global_t)(CUdeviceptr *, size_t *, CUmodule, const char *);
typedef CUresult (*memcpy_htod_t)(CUdeviceptr, const void *, size_t);

static struct {
  stream_ctx_t stream_ctx;
  ctx_push_t push;
  ctx_pop_t pop;
  memset8_t memset8;
  host_alloc_t host_alloc;
  host_device_pointer_t host_device_pointer;
  free_host_t free_host;
  module_global_t module_global;
  memcpy_htod_t memcpy_htod;
} more;

static int need_more(void) {
  if (more.stream_ctx != NULL) return 0;
  int missing = 0;
  more.stream_ctx = (stream_ctx_t)symbol("cuStreamGetCtx", &missing);
  more.push = (ctx_push_t)symbol("cuCtxPushCurrent_v2", &missing);
  more.pop = (ctx_pop_t)symbol("cuCtxPopCurrent_v2", &missing);
  more.memset8 = (memset8_t)symbol("cuMemsetD8Async", &missing);
  more.host_alloc = (host_alloc_t)symbol("cuMemHostAlloc", &missing);
  more.host_device_pointer = (host_device_pointer_t)symbol("cuMemHostGetDevicePointer_v2", &missing);
  more.free_host = (free_host_t)symbol("cuMemFreeHost", &missing);
  more.module_global = (module_global_t)symbol("cuModuleGetGlobal_v2", &missing);
  more.memcpy_htod = (memcpy_htod_t)symbol("cuMemcpyHtoD_v2", &missing);
  if (missing) {
    memset(&more, 0, sizeof more);
    return (int)CUDA_ERROR_NOT_SUPPORTED;
  }
  return 0;
}

/* The stream's context made current for the calls that follow (TF's executor threads may have none). */
static int enter(CUstream stream) {
  if (need_more() != 0) return (int)CUDA_ERROR_NOT_SUPPORTED;
  CUcontext context;
  CALL(more.stream_ctx(stream, &context), "cuStreamGetCtx");
  CALL(more.push(context), "cuCtxPushCurrent");
  return 0;
}

/* `context` made current (a program's own, to free what it holds from any thread). */
static int enter_context(CUcontext context) {
  if (need_more() != 0) return (int)CUDA_ERROR_NOT_SUPPORTED;
  CALL(more.push(context), "cuCtxPushCurrent");
  return 0;
}

static void leave(void) {
  CUcontext ignored;
  more.pop(&ignored);
}

typedef CUresult (*device_get_t)(CUdevice *, int);
typedef CUresult (*primary_retain_t)(CUcontext *, CUdevice);
typedef CUresult (*primary_release_t)(CUdevice);

/* The device's primary context (the one TF, torch and JAX use) made current, for calls outside a
   stream (occupancy at plan time); sf_primary_leave undoes it. */
int sf_primary_enter(int ordinal) {
  NEED("sf_primary_enter");
  if (need_more() != 0) return (int)CUDA_ERROR_NOT_SUPPORTED;
  int missing = 0;
  device_get_t device_get = (device_get_t)symbol("cuDeviceGet", &missing);
  primary_retain_t retain = (primary_retain_t)symbol("cuDevicePrimaryCtxRetain", &missing);
  if (missing) return (int)CUDA_ERROR_NOT_SUPPORTED;
  CUdevice device;
  CUcontext context;
  CALL(device_get(&device, ordinal), "cuDeviceGet");
  CALL(retain(&context, device), "cuDevicePrimaryCtxRetain");
  CALL(more.push(context), "cuCtxPushCurrent");
  return 0;
}

int sf_primary_leave(int ordinal) {
  NEED("sf_primary_leave");
  int missing = 0;
  device_get_t device_get = (device_get_t)symbol("cuDeviceGet", &missing);
  primary_release_t release = (primary_release_t)symbol("cuDevicePrimaryCtxRelease_v2", &missing);
  if (missing || more.pop == NULL) return (int)CUDA_ERROR_NOT_SUPPORTED;
  CUdevice device;
  CUcontext ignored;
  CALL(more.pop(&ignored), "cuCtxPopCurrent");
  CALL(device_get(&device, ordinal), "cuDeviceGet");
  CALL(release(device), "cuDevicePrimaryCtxRelease");
  return 0;
}

typedef struct sf_program {
  long long *spec;
  long long length;
  long long starts[SF_MAX_PARAMS];
  long long checks_at;
  CUmodule module;
  CUcontext context;   /* the stream's context it was loaded in: freed in it */
  int *flags;          /* mapped host memory: [0] a stitched kernel stored NaN/Inf, [1] blamed */
  CUdeviceptr flags_d; /* the same words as the device sees them */
  CUfunction functions[SF_MAX_PARAMS];
  CUfunction blames[4];
} sf_program;

/* The two flag words in mapped host memory, zeroed, and the module's `sf_nonfinite_flag` pointed at the
   first (a module without that global, rendered before it existed, notes nothing: NOT_FOUND only; any other
   failure of the look-up fails the program rather than silently leaving its kernels unchecked). */
static int create_flags(sf_program *program) {
  void *memory = NULL;
  CALL(more.host_alloc(&memory, 2 * sizeof(int), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
       "cuMemHostAlloc(non-finite flags)");
  program->flags = (int *)memory;
  program->flags[0] = program->flags[1] = 0;
  CALL(more.host_device_pointer(&program->flags_d, memory, 0), "cuMemHostGetDevicePointer(non-finite flags)");
  CUdeviceptr global = 0;
  size_t bytes = 0;
  const CUresult found = more.module_global(&global, &bytes, program->module, "sf_nonfinite_flag");
  if (found == CUDA_ERROR_NOT_FOUND) return 0;
  if (found != CUDA_SUCCESS) return fail("cuModuleGetGlobal(sf_nonfinite_flag)", found);
  if (bytes != sizeof(CUdeviceptr)) {
    snprintf(last_error, sizeof last_error, "cuModuleGetGlobal(sf_nonfinite_flag): %zu bytes, not a pointer", bytes);
    return (int)CUDA_ERROR_INVALID_VALUE;
  }
  CALL(more.memcpy_htod(global, &program->flags_d, sizeof(CUdeviceptr)), "cuMemcpyHtoD(sf_nonfinite_flag)");
  return 0;
}

static int load_program(sf_program *program, const void *image, const char *const *names) {
  CALL(cu.module_load(&program->module, image), "cuModuleLoadData");
  int sms = 0, major = 0, minor = 0, cooperative = 0;
  int status = sf_device_info(&sms, &major, &minor, &cooperative);
  if (status != 0) return status;
  const long long *spec = program->spec;
  for (long long k = 0; k < spec[5]; ++k) {
    const long long at = program->starts[k];
    int registers = 0, smem = 0;
    status = sf_function(program->module, names[k], (int)spec[at + 2], &program->functions[k], &registers, &smem);
    if (status != 0) return status;
    if (!spec[at + 3]) continue;
    int per_sm = 0;
    status = sf_occupancy(program->functions[k], (int)spec[at + 1], (size_t)spec[at + 2], &per_sm);
    if (status != 0) return status;
    if (!cooperative || spec[at] > sf_coresident_grid(per_sm, sms)) {
      const long long holds = sf_coresident_grid(per_sm, sms);
      snprintf(last_error, sizeof last_error, "%s: grid %lld with a grid barrier, the device holds %lld%s", names[k],
               spec[at], holds, cooperative ? " at once" : " (no cooperative launch)");
      return (int)CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
  }
  for (long long c = 0, at = program->checks_at + 1; c < spec[program->checks_at]; ++c, at += 3) {
    const long long dtype = spec[at + 2];
    if (program->blames[dtype] == NULL)
      CALL(cu.module_function(&program->blames[dtype], program->module, sf_blame_names[dtype]),
           "cuModuleGetFunction(blame)");
  }
  return create_flags(program);
}

/* Frees what the program holds (its module, its pinned flags) in the context it was loaded in. */
void sf_program_destroy(sf_program *program) {
  if (program == NULL) return;
  const int entered = program->context != NULL && enter_context(program->context) == 0;
  if (program->module != NULL && cu.module_unload != NULL) cu.module_unload(program->module);
  if (program->flags != NULL && more.free_host != NULL) more.free_host(program->flags);
  if (entered) leave();
  free(program->spec);
  free(program);
}

/* Loads `image` in the context of `stream` and checks every grid-barrier kernel is co-resident. */
int sf_program_create(const void *image, const long long *spec, long long length, const char *const *names,
                      CUstream stream, sf_program **out) {
  NEED("sf_program_create");
  *out = NULL;
  sf_program *program = (sf_program *)calloc(1, sizeof(sf_program));
  if (program == NULL) return (int)CUDA_ERROR_OUT_OF_MEMORY;
  int status = walk(spec, length, program->starts, SF_MAX_PARAMS, &program->checks_at);
  if (status == 0 && spec[5] > SF_MAX_PARAMS) status = invalid("too many kernels", 5);
  program->spec = (long long *)malloc(sizeof(long long) * (size_t)length);
  if (status == 0 && program->spec == NULL) status = (int)CUDA_ERROR_OUT_OF_MEMORY;
  if (status == 0) {
    memcpy(program->spec, spec, sizeof(long long) * (size_t)length);
    program->length = length;
    status = enter(stream);
    if (status == 0) {
      more.stream_ctx(stream, &program->context);
      status = load_program(program, image, names);
      leave();
    }
  }
  if (status != 0) {
    sf_program_destroy(program);
    return status;
  }
  *out = program;
  return 0;
}

static int run_kernels(sf_program *program, void *const *inputs, void *const *outputs, CUdeviceptr scratch,
                       CUstream stream) {
  const long long *spec = program->spec;
  unsigned long long values[SF_MAX_PARAMS];
  void *args[SF_MAX_PARAMS];
  for (int k = 0; k < (int)spec[5]; ++k) {
    long long at = program->starts[k];
    const long long zeros_at = at + 5 + 2 * spec[at + 4];
    for (long long z = 0, zat = zeros_at + 1; z < spec[zeros_at]; ++z, zat += 2)
      CALL(more.memset8(scratch + (CUdeviceptr)spec[zat], 0, (size_t)spec[zat + 1], stream), "cuMemsetD8Async");
    int count = 0;
    int status = sf_pack(spec, program->length, k, inputs, outputs, scratch, values, SF_MAX_PARAMS, &count);
    if (status != 0) return status;
    for (int p = 0; p < count; ++p) args[p] = &values[p];
    CUdeviceptr counter = spec[at + 3] ? (CUdeviceptr)values[count - 1] : 0;
    status = sf_launch(program->functions[k], (unsigned)spec[at], (unsigned)spec[at + 1], (unsigned)spec[at + 2],
                       stream, args, counter);
    if (status != 0) return status;
  }
  return 0;
}

/* One step: every kernel in order on `stream`. Asynchronous: nothing here waits for the GPU. */
int sf_program_run(sf_program *program, void *const *inputs, void *const *outputs, CUdeviceptr scratch,
                   CUstream stream) {
  NEED("sf_program_run");
  int status = enter(stream);
  if (status != 0) return status;
  status = run_kernels(program, inputs, outputs, scratch, stream);
  leave();
  return status;
}

/* The program's two flag words in mapped host memory ([0] noted NaN/Inf, [1] blamed): the host reads and
   resets them (an atomic exchange) when it likes, without synchronising any stream. */
int *sf_program_flags(sf_program *program) { return program == NULL ? NULL : program->flags; }

/* After a judged call: sf_blame_<dtype> over each checked output, ours against TF's values for it (`theirs`,
   in output order), on `stream` after both; sets flag word 1 where ours is NaN/Inf and TF's finite. */
int sf_program_blame(sf_program *program, void *const *ours, void *const *theirs, CUstream stream) {
  NEED("sf_program_blame");
  int status = enter(stream);
  if (status != 0) return status;
  const long long *spec = program->spec;
  CUdeviceptr blamed = program->flags_d + sizeof(int);
  for (long long c = 0, at = program->checks_at + 1; status == 0 && c < spec[program->checks_at]; ++c, at += 3) {
    CUdeviceptr mine = (CUdeviceptr)(size_t)ours[spec[at]], tf = (CUdeviceptr)(size_t)theirs[spec[at]];
    long long elements = spec[at + 1];
    if (elements == 0) continue;
    void *args[4] = {&mine, &tf, &elements, &blamed};
    long long grid = (elements + 255) / 256;
    status = sf_launch(program->blames[spec[at + 2]], (unsigned)(grid < 1024 ? grid : 1024), 256, 0, stream, args, 0);
  }
  leave();
  return status;
}
