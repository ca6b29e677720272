/* A fake libnvidia-ml.so.1 for farm's tests: the NVML entry points pynvml calls for hardware
 * detection and sampling, driven by a state file so a test can change values while sampling.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o libnvidia-ml.so.1 fake_nvml.c
 * State file: path in $FAKE_NVML_STATE, else nvml.state beside this library (for processes whose environment
 * is an allowlist, e.g. a job's server), re-read on every call, one setting per line:
 *   driver 550.54.15
 *   init_error 9                       (nvmlInit fails with this NVML return code)
 *   gpu <i> uuid GPU-...
 *   gpu <i> name NVIDIA A100-SXM4-40GB
 *   gpu <i> mem_total|mem_used <bytes>
 *   gpu <i> util_gpu|util_mem <percent>
 *   gpu <i> power_mw <milliwatts>      (-1: NVML_ERROR_NOT_SUPPORTED)
 *   gpu <i> cc <major> <minor>
 *   gpu <i> proc <pid> <bytes>         (one line per compute process; bytes -1 = not available)
 * The device count is the highest <i> + 1. Writers should replace the file atomically (rename).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_UNKNOWN 999

#define MAX_GPUS 8
#define MAX_PROCS 16

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    int index;
    char uuid[96];
    char name[96];
    unsigned long long mem_total, mem_used;
    unsigned int util_gpu, util_mem;
    long long power_mw;
    int cc_major, cc_minor;
    int nprocs;
    unsigned int proc_pid[MAX_PROCS];
    long long proc_mem[MAX_PROCS];
} fake_gpu;

typedef struct {
    char driver[80];
    int init_error;
    int count;
    fake_gpu gpus[MAX_GPUS];
} fake_state;

static fake_state state;
static int initialized = 0;

static void load_state(void) {
    memset(&state, 0, sizeof state);
    strcpy(state.driver, "0.0.0");
    for (int i = 0; i < MAX_GPUS; i++) {
        state.gpus[i].index = i;
        state.gpus[i].power_mw = 0;
        state.gpus[i].cc_major = 8;
    }
    const char *path = getenv("FAKE_NVML_STATE");
    char beside[4096];
    Dl_info info;
    if (!path && dladdr((void *)load_state, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        size_t dir = slash ? (size_t)(slash - info.dli_fname) : 0;
        if (dir + sizeof "/nvml.state" > sizeof beside) return;
        memcpy(beside, info.dli_fname, dir);
        strcpy(beside + dir, slash ? "/nvml.state" : "nvml.state");
        path = beside;
    }
    if (!path) return;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        char key[64];
        int i;
        if (sscanf(line, "driver %79s", state.driver) == 1) continue;
        if (sscanf(line, "init_error %d", &state.init_error) == 1) continue;
        int off = 0;
        if (sscanf(line, "gpu %d %63s %n", &i, key, &off) < 2 || i < 0 || i >= MAX_GPUS) continue;
        if (i + 1 > state.count) state.count = i + 1;
        fake_gpu *g = &state.gpus[i];
        const char *rest = line + off;
        if (!strcmp(key, "uuid")) snprintf(g->uuid, sizeof g->uuid, "%s", rest);
        else if (!strcmp(key, "name")) snprintf(g->name, sizeof g->name, "%s", rest);
        else if (!strcmp(key, "mem_total")) g->mem_total = strtoull(rest, NULL, 10);
        else if (!strcmp(key, "mem_used")) g->mem_used = strtoull(rest, NULL, 10);
        else if (!strcmp(key, "util_gpu")) g->util_gpu = (unsigned)atoi(rest);
        else if (!strcmp(key, "util_mem")) g->util_mem = (unsigned)atoi(rest);
        else if (!strcmp(key, "power_mw")) g->power_mw = atoll(rest);
        else if (!strcmp(key, "cc")) sscanf(rest, "%d %d", &g->cc_major, &g->cc_minor);
        else if (!strcmp(key, "proc") && g->nprocs < MAX_PROCS) {
            unsigned int pid; long long mem;
            if (sscanf(rest, "%u %lld", &pid, &mem) == 2) {
                g->proc_pid[g->nprocs] = pid;
                g->proc_mem[g->nprocs] = mem;
                g->nprocs++;
            }
        }
    }
    fclose(f);
}

/* Re-read the state and resolve a handle (a pointer into the state's array) to its index. */
static fake_gpu *dev(void *handle) {
    if (!handle) return NULL;
    int i = ((fake_gpu *)handle)->index;
    load_state();
    if (i < 0 || i >= state.count) return NULL;
    return &state.gpus[i];
}

#define NEED_INIT() do { if (!initialized) return NVML_ERROR_UNINITIALIZED; } while (0)

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    load_state();
    if (state.init_error) return state.init_error;
    initialized = 1;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { NEED_INIT(); initialized = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case 9: return "Driver Not Loaded";
    default: return "Fake NVML error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    NEED_INIT();
    load_state();
    if (!version || length < strlen(state.driver) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, state.driver);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    NEED_INIT();
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    load_state();
    *count = (unsigned)state.count;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    NEED_INIT();
    if (!device) return NVML_ERROR_INVALID_ARGUMENT;
    load_state();
    if (index >= (unsigned)state.count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &state.gpus[index];
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, void **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    NEED_INIT();
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    load_state();
    for (int i = 0; i < state.count; i++) {
        if (!strcmp(state.gpus[i].uuid, uuid)) { *device = &state.gpus[i]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}

static nvmlReturn_t copy_str(const char *s, char *out, unsigned int length) {
    if (!out || length < strlen(s) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, s);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(void *device, unsigned int *index) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g || !index) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)g->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_str(g->uuid, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g) return NVML_ERROR_INVALID_ARGUMENT;
    return copy_str(g->name, name, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = g->mem_total;
    memory->used = g->mem_used;
    memory->free = g->mem_total > g->mem_used ? g->mem_total - g->mem_used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *util) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g || !util) return NVML_ERROR_INVALID_ARGUMENT;
    util->gpu = g->util_gpu;
    util->memory = g->util_mem;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(void *device, unsigned int *power) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g || !power) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->power_mw < 0) return NVML_ERROR_NOT_SUPPORTED;
    *power = (unsigned)g->power_mw;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(void *device, int *major, int *minor) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g || !major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

/* NVML semantics: with too small an array, set *count to the number needed and return
 * INSUFFICIENT_SIZE; with no processes, return SUCCESS and *count = 0. */
static nvmlReturn_t running(void *device, unsigned int *count, nvmlProcessInfo_t *infos) {
    NEED_INIT();
    fake_gpu *g = dev(device);
    if (!g || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = (unsigned)g->nprocs;
    if (n == 0) { *count = 0; return NVML_SUCCESS; }
    if (!infos || *count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    for (unsigned int k = 0; k < n; k++) {
        infos[k].pid = g->proc_pid[k];
        infos[k].usedGpuMemory = g->proc_mem[k] < 0 ? ~0ULL : (unsigned long long)g->proc_mem[k];
        infos[k].gpuInstanceId = ~0U;
        infos[k].computeInstanceId = ~0U;
    }
    *count = n;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *d, unsigned int *c, nvmlProcessInfo_t *p) {
    return running(d, c, p);
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void *d, unsigned int *c, nvmlProcessInfo_t *p) {
    return running(d, c, p);
}
