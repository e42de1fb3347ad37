// Every kernel's start and end on the GPU as a program runs it, CUDA graph replays included:
// a CUPTI injection library (the driver loads it at cuInit when CUDA_INJECTION64_PATH names it),
// so the decode step's timeline can be read as the graph runs it, with the gaps between kernels
// and PDL's overlaps, where Nsight Compute times each kernel alone with its caches flushed, and
// the device machine has no Nsight Systems. Writes CSV to $KTRACE_OUT (default ktrace.csv), the
// memory copies too (name "memcpy kind K N B", grid and block 0), and with KTRACE_API set the
// host's runtime calls (name "api cudaGraphLaunch..." and so on, grid -1, host timestamps on the
// same clock):
//   start_ns,end_ns,graph_id,node_id,grid,block,name
// Build (here; bundle.sh then packs it with libcupti into build/dev/lib):
//   g++ -O2 -shared -fPIC -I/usr/local/cuda/include tools/device/kernel_trace.cpp
//     -L/usr/local/cuda/lib64 -lcupti -Wl,-rpath,'$ORIGIN' -o build/dev/lib/libkernel_trace.so
// Use: CUDA_INJECTION64_PATH=$PWD/build/dev/lib/libkernel_trace.so KTRACE_OUT=t.csv ds41rt bench ...
// then tools/device/trace_table.py t.csv.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

constexpr size_t BUFFER_BYTES = 4u << 20;
std::FILE *out = nullptr;
std::mutex out_mu;

// "void (anonymous namespace)::gemv_kernel<0, 1>(batch)" -> "gemv_kernel<0, 1>".
std::string short_name(const char *mangled) {
    int st = 0;
    char *d = abi::__cxa_demangle(mangled, nullptr, nullptr, &st);
    std::string s = st == 0 && d ? d : mangled;
    std::free(d);
    int depth = 0;  // cut the parameter list: the first '(' outside template brackets
    for (size_t i = 0; i < s.size(); i++) {
        if (s[i] == '<') depth++;
        else if (s[i] == '>') depth--;
        else if (s[i] == '(' && depth == 0 && s.compare(i, 11, "(anonymous ") != 0) {
            s.resize(i);
            break;
        }
    }
    for (const char *drop : {"(anonymous namespace)::", "ds41rt::backend::cuda::", "void "})
        for (size_t p; (p = s.find(drop)) != std::string::npos;) s.erase(p, std::strlen(drop));
    for (char &c : s)
        if (c == ',') c = ';';  // a CSV field
    return s;
}

void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = static_cast<uint8_t *>(std::aligned_alloc(8, BUFFER_BYTES));
    *size = BUFFER_BYTES;
    *max_records = 0;
}

void CUPTIAPI completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(out_mu);
    CUpti_Activity *r = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {  // host side: the runtime call's span, grid -1
            const auto *a = reinterpret_cast<const CUpti_ActivityAPI *>(r);
            const char *nm = nullptr;
            if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &nm) != CUPTI_SUCCESS || !nm) nm = "?";
            if (out)
                std::fprintf(out, "%llu,%llu,0,0,-1,0,api %s\n", (unsigned long long)a->start, (unsigned long long)a->end, nm);
            continue;
        }
        if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // the step's uploads, named by kind and size
            const auto *m = reinterpret_cast<const CUpti_ActivityMemcpy6 *>(r);
            if (out)
                std::fprintf(out, "%llu,%llu,%u,%llu,0,0,memcpy kind %u %llu B\n", (unsigned long long)m->start,
                             (unsigned long long)m->end, m->graphId, (unsigned long long)m->graphNodeId, unsigned(m->copyKind),
                             (unsigned long long)m->bytes);
            continue;
        }
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && r->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const auto *k = reinterpret_cast<const CUpti_ActivityKernel10 *>(r);
        if (out)
            std::fprintf(out, "%llu,%llu,%u,%llu,%d,%d,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                         k->graphId, (unsigned long long)k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                         k->blockX * k->blockY * k->blockZ, short_name(k->name).c_str());
    }
    std::free(buffer);
}

void flush() {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(out_mu);
    if (out) std::fflush(out);
}

// The runtime destroys the primary context in its own exit handler, which runs before ours
// (registered earlier): flush while the context still exists.
void CUPTIAPI on_resource(void *, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void *) {
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && id == CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING) flush();
}

}  // namespace

extern "C" int InitializeInjection(void) {
    const char *path = std::getenv("KTRACE_OUT");
    out = std::fopen(path ? path : "ktrace.csv", "w");
    if (!out) return 0;
    std::fprintf(out, "start_ns,end_ns,graph_id,node_id,grid,block,name\n");
    CUpti_SubscriberHandle sub;
    if (cuptiSubscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(on_resource), nullptr) == CUPTI_SUCCESS)
        cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING);
    cuptiActivityRegisterCallbacks(requested, completed);
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        std::fprintf(stderr, "kernel_trace: cannot enable kernel activity records\n");
        return 0;
    }
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    if (std::getenv("KTRACE_API")) cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    std::atexit(flush);
    return 1;
}
