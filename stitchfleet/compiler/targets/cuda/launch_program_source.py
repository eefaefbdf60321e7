"""The C source of the launch library's program runner: one cluster's kernels launched in order on a stream.

Input: nothing (constant text). Output: `SOURCE`, appended to `launch_source.SOURCE` (it uses that
part's `cu` table and `CALL`/`NEED` macros). A program is what the TF GPU op runs per step and what
the `gpu` tier drives from Python: a cubin plus a *spec*, a flat int64 array written by
`launch_plan.LaunchPlan` (so Python, C and C++ share one description and nothing is parsed twice):

    [version, inputs, outputs, scratch_bytes, counter_offset (-1: none), kernels,
     per kernel: grid, block, dynamic_smem, barrier, params, params x (kind, value), zeros, zeros x (offset, bytes),
     checks, checks x (output, elements, dtype)]

A param's kind is 0 (op input `value`), 1 (op output `value`) or 2 (byte offset `value` into the
per-launch scratch allocation); a kernel with a grid barrier gets the counter at `counter_offset`
as its last argument. `zeros` are scratch ranges cleared on the stream before that kernel
(cross-block partials, atomically combined targets). A check runs `sf_nonfinite_<dtype>` over a
floating output and sets a flag in mapped host memory (`sf_flag_create`): the host reads it when
it likes, without synchronising the stream. `sf_spec_check` and `sf_pack` are pure (no driver):
CI tests them on any machine.
"""

SOURCE = r"""
#include <stdlib.h>

enum { SF_SPEC_VERSION = 1, SF_HEADER = 6, SF_MAX_PARAMS = 256, SF_ALIGN = 16 };
enum { SF_INPUT = 0, SF_OUTPUT = 1, SF_SCRATCH = 2 };
static const char* const sf_check_names[4] = {"sf_nonfinite_f32", "sf_nonfinite_f16", "sf_nonfinite_bf16",
                                              "sf_nonfinite_f64"};

static int invalid(const char* what, long long at) {
    snprintf(last_error, sizeof last_error, "launch spec: %s (at %lld)", what, at);
    return (int)CUDA_ERROR_INVALID_VALUE;
}

/* Walks the spec; returns 0 when every field is in range, else the reason. The position of kernel
   k's first field is written to starts[k] (room for `room` kernels), the checks' to *checks_at. */
static int walk(const long long* spec, long long length, long long* starts, int room, long long* checks_at) {
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

int sf_spec_check(const long long* spec, long long length) {
    long long checks_at = 0;
    return walk(spec, length, NULL, 0, &checks_at);
}

/* Kernel k's argument values (device pointers) in parameter order, then the counter when it has a
   grid barrier; refuses a null or unaligned buffer. *count receives how many values were written. */
int sf_pack(const long long* spec, long long length, int k, void* const* inputs, void* const* outputs,
            unsigned long long scratch, unsigned long long* values, int capacity, int* count) {
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

typedef CUresult (*stream_ctx_t)(CUstream, CUcontext*);
typedef CUresult (*ctx_push_t)(CUcontext);
typedef CUresult (*ctx_pop_t)(CUcontext*);
typedef CUresult (*memset8_t)(CUdeviceptr, unsigned char, size_t, CUstream);
typedef CUresult (*host_alloc_t)(void**, size_t, unsigned int);
typedef CUresult (*host_device_pointer_t)(CUdeviceptr*, void*, unsigned int);

static struct {
    stream_ctx_t stream_ctx;
    ctx_push_t push;
    ctx_pop_t pop;
    memset8_t memset8;
    host_alloc_t host_alloc;
    host_device_pointer_t host_device_pointer;
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

static void leave(void) {
    CUcontext ignored;
    more.pop(&ignored);
}

typedef CUresult (*device_get_t)(CUdevice*, int);
typedef CUresult (*primary_retain_t)(CUcontext*, CUdevice);
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
    long long* spec;
    long long length;
    long long starts[SF_MAX_PARAMS];
    long long checks_at;
    CUmodule module;
    CUfunction functions[SF_MAX_PARAMS];
    CUfunction checks[4];
} sf_program;

static int load_program(sf_program* program, const void* image, const char* const* names) {
    CALL(cu.module_load(&program->module, image), "cuModuleLoadData");
    int sms = 0, major = 0, minor = 0, cooperative = 0;
    int status = sf_device_info(&sms, &major, &minor, &cooperative);
    if (status != 0) return status;
    const long long* spec = program->spec;
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
            snprintf(last_error, sizeof last_error, "%s: grid %lld with a grid barrier, the device holds %lld%s",
                     names[k], spec[at], holds, cooperative ? " at once" : " (no cooperative launch)");
            return (int)CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
        }
    }
    for (long long c = 0, at = program->checks_at + 1; c < spec[program->checks_at]; ++c, at += 3) {
        const long long dtype = spec[at + 2];
        if (program->checks[dtype] == NULL)
            CALL(cu.module_function(&program->checks[dtype], program->module, sf_check_names[dtype]),
                 "cuModuleGetFunction(nonfinite check)");
    }
    return 0;
}

void sf_program_destroy(sf_program* program) {
    if (program == NULL) return;
    if (program->module != NULL && cu.module_unload != NULL) cu.module_unload(program->module);
    free(program->spec);
    free(program);
}

/* Loads `image` in the context of `stream` and checks every grid-barrier kernel is co-resident. */
int sf_program_create(const void* image, const long long* spec, long long length, const char* const* names,
                      CUstream stream, sf_program** out) {
    NEED("sf_program_create");
    *out = NULL;
    sf_program* program = (sf_program*)calloc(1, sizeof(sf_program));
    if (program == NULL) return (int)CUDA_ERROR_OUT_OF_MEMORY;
    int status = walk(spec, length, program->starts, SF_MAX_PARAMS, &program->checks_at);
    if (status == 0 && spec[5] > SF_MAX_PARAMS) status = invalid("too many kernels", 5);
    program->spec = (long long*)malloc(sizeof(long long) * (size_t)length);
    if (status == 0 && program->spec == NULL) status = (int)CUDA_ERROR_OUT_OF_MEMORY;
    if (status == 0) {
        memcpy(program->spec, spec, sizeof(long long) * (size_t)length);
        program->length = length;
        status = enter(stream);
        if (status == 0) {
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

static int run_kernels(sf_program* program, void* const* inputs, void* const* outputs, CUdeviceptr scratch,
                       CUstream stream) {
    const long long* spec = program->spec;
    unsigned long long values[SF_MAX_PARAMS];
    void* args[SF_MAX_PARAMS];
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

static int run_checks(sf_program* program, void* const* outputs, CUdeviceptr flag, CUstream stream) {
    const long long* spec = program->spec;
    for (long long c = 0, at = program->checks_at + 1; c < spec[program->checks_at]; ++c, at += 3) {
        CUdeviceptr data = (CUdeviceptr)(size_t)outputs[spec[at]];
        long long elements = spec[at + 1];
        if (elements == 0) continue;
        void* args[3] = {&data, &elements, &flag};
        long long grid = (elements + 255) / 256;
        int status = sf_launch(program->checks[spec[at + 2]], (unsigned)(grid < 1024 ? grid : 1024), 256, 0, stream,
                               args, 0);
        if (status != 0) return status;
    }
    return 0;
}

/* One step: every kernel in order on `stream`, then the non-finite checks when `flag` is given.
   Asynchronous: nothing here waits for the GPU. */
int sf_program_run(sf_program* program, void* const* inputs, void* const* outputs, CUdeviceptr scratch,
                   CUdeviceptr flag, CUstream stream) {
    NEED("sf_program_run");
    int status = enter(stream);
    if (status != 0) return status;
    status = run_kernels(program, inputs, outputs, scratch, stream);
    if (status == 0 && flag != 0) status = run_checks(program, outputs, flag, stream);
    leave();
    return status;
}

/* A flag in pinned host memory the GPU writes through its device alias: read by the host at any time.
   Allocated in the context of `stream` (a TF executor thread may have no context current). */
int sf_flag_create(CUstream stream, int** host, CUdeviceptr* device) {
    NEED("sf_flag_create");
    int status = enter(stream);
    if (status != 0) return status;
    void* memory = NULL;
    CUresult result = more.host_alloc(&memory, sizeof(int), CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (result == CUDA_SUCCESS) {
        *(volatile int*)memory = 0;
        result = more.host_device_pointer(device, memory, 0);
    }
    leave();
    if (result != CUDA_SUCCESS) return fail("cuMemHostAlloc/cuMemHostGetDevicePointer (non-finite flag)", result);
    *host = (int*)memory;
    return 0;
}
"""

# The non-finite checks, compiled into every cluster's module beside its kernels (NVRTC, same options).
CHECKS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define SF_CHECK(NAME, T, AS_FLOAT) \
  extern "C" __global__ void NAME(const T* __restrict__ x, long long n, volatile int* flag) { \
    int bad = 0; \
    const long long stride = (long long)gridDim.x * blockDim.x; \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) \
      bad |= !isfinite(AS_FLOAT(x[i])); \
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1; \
  }
#define SF_SAME(v) (v)
SF_CHECK(sf_nonfinite_f32, float, SF_SAME)
SF_CHECK(sf_nonfinite_f16, __half, __half2float)
SF_CHECK(sf_nonfinite_bf16, __nv_bfloat16, __bfloat162float)
SF_CHECK(sf_nonfinite_f64, double, SF_SAME)
"""
