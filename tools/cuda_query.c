/* A CUDA device query that needs nothing from the image but libc: it loads the driver's libcuda.so.1
 * (which the CDI spec mounts) with dlopen, lists the devices, and allocates and frees memory on each,
 * so a zero exit means the GPU is usable from that container. Built by tools/gpu_check_prepare.sh. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_count_t)(int *);
typedef int (*cu_get_t)(int *, int);
typedef int (*cu_name_t)(char *, int, int);
typedef int (*cu_mem_t)(size_t *, int);
typedef int (*cu_ctx_create_t)(void **, unsigned int, int);
typedef int (*cu_ctx_destroy_t)(void *);
typedef int (*cu_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_free_t)(unsigned long long);

static void *need(void *lib, const char *name) {
    void *fn = dlsym(lib, name);
    if (fn == NULL) {
        fprintf(stderr, "cuda-query: libcuda.so.1 has no %s\n", name);
        exit(2);
    }
    return fn;
}

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "cuda-query: cannot load libcuda.so.1: %s\n", dlerror());
        return 2;
    }
    cu_init_t init = (cu_init_t)need(lib, "cuInit");
    cu_count_t count = (cu_count_t)need(lib, "cuDeviceGetCount");
    cu_get_t get = (cu_get_t)need(lib, "cuDeviceGet");
    cu_name_t name = (cu_name_t)need(lib, "cuDeviceGetName");
    cu_mem_t mem = (cu_mem_t)need(lib, "cuDeviceTotalMem_v2");
    cu_ctx_create_t create = (cu_ctx_create_t)need(lib, "cuCtxCreate_v2");
    cu_ctx_destroy_t destroy = (cu_ctx_destroy_t)need(lib, "cuCtxDestroy_v2");
    cu_alloc_t alloc = (cu_alloc_t)need(lib, "cuMemAlloc_v2");
    cu_free_t release = (cu_free_t)need(lib, "cuMemFree_v2");
    int rc = init(0), n = 0;
    if (rc != 0 || (rc = count(&n)) != 0) {
        fprintf(stderr, "cuda-query: cuInit/cuDeviceGetCount failed with CUresult %d\n", rc);
        return 1;
    }
    printf("CUDA devices: %d\n", n);
    for (int i = 0; i < n; i++) {
        int device;
        char text[256];
        size_t total = 0;
        void *ctx = NULL;
        unsigned long long block = 0;
        if ((rc = get(&device, i)) != 0 || (rc = name(text, sizeof text, device)) != 0 ||
            (rc = mem(&total, device)) != 0 || (rc = create(&ctx, 0, device)) != 0 ||
            (rc = alloc(&block, 64u << 20)) != 0 || (rc = release(block)) != 0 || (rc = destroy(ctx)) != 0) {
            fprintf(stderr, "cuda-query: device %d failed with CUresult %d\n", i, rc);
            return 1;
        }
        printf("device %d: %s, %zu MiB, 64 MiB allocated and freed\n", i, text, total >> 20);
    }
    return n > 0 ? 0 : 1;
}
