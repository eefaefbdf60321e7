"""The C source of the launch library: load a cubin, check occupancy, launch on a given stream.

Input: nothing (the text is a constant). Output: `SOURCE`, C99 against the CUDA driver API's
header (`cuda.h`, from the `nvidia-cuda-runtime-cu12` wheel or a toolkit), built by
`launch_library.build`. The library opens `libcuda.so.1` itself with dlopen at `sf_init`, so it
builds and loads on a machine without a GPU driver (CI) and says so there, instead of failing
to load. One C ABI serves two callers: the TF GPU op (C++, TF's compute stream) and Python via
ctypes (the `gpu` test tier, with pycuda or torch memory and streams).

Why these calls:
- a kernel with a grid barrier is launched with `cuLaunchCooperativeKernel`, which guarantees
  every block is resident at once (or fails with COOPERATIVE_LAUNCH_TOO_LARGE): it never hangs
  when NCCL/Horovod kernels or MPS share the GPU, as a plain launch of a full wave can;
- the barrier counter is zeroed on the launch's own stream right before the launch, so each
  launch may use a fresh scratch allocation and two steps in flight never share a counter;
- occupancy comes from `cuOccupancyMaxActiveBlocksPerMultiprocessor` for the compiled function
  (its real registers and shared memory), not from the planner's model.
Every call returns the CUresult (0: success); `sf_last_error` names the failed call and the
driver's message, per thread. The program runner (a cluster's kernels in order, per-launch
scratch, non-finite flags) follows in `launch_program_source`.
"""

from stitchfleet.compiler.targets.cuda.launch_program_source import SOURCE as PROGRAM

DRIVER = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static __thread char last_error[512];

typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*ctx_get_device_t)(CUdevice*);
typedef CUresult (*device_attribute_t)(int*, CUdevice_attribute, CUdevice);
typedef CUresult (*module_load_t)(CUmodule*, const void*);
typedef CUresult (*module_unload_t)(CUmodule);
typedef CUresult (*module_function_t)(CUfunction*, CUmodule, const char*);
typedef CUresult (*function_attribute_t)(int*, CUfunction_attribute, CUfunction);
typedef CUresult (*function_set_attribute_t)(CUfunction, CUfunction_attribute, int);
typedef CUresult (*occupancy_t)(int*, CUfunction, int, size_t);
typedef CUresult (*memset_t)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*launch_t)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, CUstream, void**, void**);
typedef CUresult (*cooperative_t)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, unsigned int, CUstream, void**);
typedef CUresult (*error_string_t)(CUresult, const char**);

static struct {
    void* handle;
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

static int fail(const char* call, CUresult status) {
    const char* text = NULL;
    if (cu.error_string == NULL || cu.error_string(status, &text) != CUDA_SUCCESS || text == NULL) text = "unknown";
    snprintf(last_error, sizeof last_error, "%s failed: %s (CUresult %d)", call, text, (int)status);
    return (int)status;
}

#define CALL(expr, name) do { CUresult status_ = (expr); \
    if (status_ != CUDA_SUCCESS) return fail(name, status_); } while (0)
#define NEED(name) do { if (cu.handle == NULL) { snprintf(last_error, sizeof last_error, \
    "%s: the launch library is not initialised (sf_init)", name); return (int)CUDA_ERROR_NOT_INITIALIZED; } } while (0)

const char* sf_last_error(void) { return last_error; }

static void* symbol(const char* name, int* missing) {
    void* found = dlsym(cu.handle, name);
    if (found == NULL && *missing == 0) {
        snprintf(last_error, sizeof last_error, "libcuda.so.1 lacks %s (driver too old)", name);
        *missing = 1;
    }
    return found;
}

int sf_init(void) {
    if (cu.handle != NULL) return 0;
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
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
int sf_device_info(int* sms, int* major, int* minor, int* cooperative) {
    NEED("sf_device_info");
    CUdevice device;
    CALL(cu.ctx_get_device(&device), "cuCtxGetDevice");
    CALL(cu.device_attribute(sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "cuDeviceGetAttribute(SMs)");
    CALL(cu.device_attribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "cuDeviceGetAttribute");
    CALL(cu.device_attribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "cuDeviceGetAttribute");
    CALL(cu.device_attribute(cooperative, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, device), "cuDeviceGetAttribute");
    return 0;
}

int sf_module_load(const void* image, CUmodule* module) {
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
int sf_function(CUmodule module, const char* name, int dynamic_smem, CUfunction* function, int* registers,
                int* static_smem) {
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

int sf_occupancy(CUfunction function, int block, size_t dynamic_smem, int* blocks_per_sm) {
    NEED("sf_occupancy");
    CALL(cu.occupancy(blocks_per_sm, function, block, dynamic_smem), "cuOccupancyMaxActiveBlocksPerMultiprocessor");
    return 0;
}

/* One launch on `stream`. `args` holds one pointer per kernel parameter, in the kernel's order
   (buffers, then the barrier counter when it has one). With a counter (a grid barrier), the
   counter is zeroed on the stream and the launch is cooperative. */
int sf_launch(CUfunction function, unsigned int grid, unsigned int block, unsigned int dynamic_smem, CUstream stream,
              void** args, CUdeviceptr counter) {
    NEED("sf_launch");
    if (counter != 0) {
        CALL(cu.memset_d32_async(counter, 0, 1, stream), "cuMemsetD32Async(barrier counter)");
        CALL(cu.cooperative(function, grid, 1, 1, block, 1, 1, dynamic_smem, stream, args),
             "cuLaunchCooperativeKernel");
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
"""

SOURCE = DRIVER + PROGRAM
