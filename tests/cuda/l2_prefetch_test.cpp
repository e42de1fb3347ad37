// backend/cuda l2_prefetch: a hint that writes nothing, so what can go wrong is stream order. The
// prefetch kernel lets the kernel after it become resident at once (programmatic dependent
// launch), which must still see everything the kernel before it wrote: out = a + b over 32 M
// floats (~100 us), the prefetch, then out2 = out + c, eagerly and replayed from a CUDA graph;
// every element must be exact (the values are small integers). Without the prefetch kernel's own
// wait for its predecessor, out2 reads out while it is being written. Tolerance: 0 bits.
#include <gtest/gtest.h>

#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/l2_prefetch.cuh"
#include "small_ops_util.h"

using namespace ds41rt;
using namespace ds41rt::backend;
using testing_util::dev_vec;

namespace {

class CudaL2Prefetch : public testing_util::CudaOps {};

TEST_F(CudaL2Prefetch, KernelsAfterItSeeWhatCameBefore) {
    const int64_t n = int64_t(32) << 20;
    std::vector<float> ha(static_cast<size_t>(n)), hb(ha.size()), hc(ha.size());
    for (int64_t i = 0; i < n; i++) ha[size_t(i)] = float(i % 1000), hb[size_t(i)] = float(i % 7), hc[size_t(i)] = float(i % 13);
    dev_vec<float> a(ha), b(hb), c(hc), out(ha.size()), out2(ha.size());
    dev_vec<uint8_t> weights(size_t(64) << 20);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const cuda::l2_range r[2] = {{weights.p, size_t(40) << 20}, {weights.p + (size_t(40) << 20), size_t(24) << 20}};
    auto issue = [&]() {
        ASSERT_TRUE(cuda::add_rows(a.p, b.p, out.p, n, false, s).is_ok());
        ASSERT_TRUE(cuda::l2_prefetch(r, 2, size_t(48) << 20, s).is_ok());
        ASSERT_TRUE(cuda::add_rows(out.p, c.p, out2.p, n, false, s).is_ok());
    };
    auto check = [&](const char *how) {
        ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
        const std::vector<float> got = out2.download();
        size_t bad = 0;
        for (int64_t i = 0; i < n; i++) bad += got[size_t(i)] != ha[size_t(i)] + hb[size_t(i)] + hc[size_t(i)];
        EXPECT_EQ(bad, 0u) << how;
    };
    for (int rep = 0; rep < 3; rep++) {
        out.poison(), out2.poison();
        issue();
        check("eager");
    }
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    issue();
    ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    for (int rep = 0; rep < 3; rep++) {
        out.poison(), out2.poison();
        ASSERT_EQ(cudaGraphLaunch(ge, s), cudaSuccess);
        check("graph replay");
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
}

TEST_F(CudaL2Prefetch, RefusesWhatItCannotIssue) {
    dev_vec<uint8_t> w(4096);
    cuda::l2_range r[cuda::L2_RANGES + 1];
    for (auto &x : r) x = {w.p, 1024};
    EXPECT_EQ(cuda::l2_prefetch(r, cuda::L2_RANGES + 1, 1 << 20, nullptr).code(), status_code::INVALID_ARGUMENT);
    const cuda::l2_range odd{w.p + 8, 1024};
    EXPECT_EQ(cuda::l2_prefetch(&odd, 1, 1 << 20, nullptr).code(), status_code::INVALID_ARGUMENT);
    EXPECT_TRUE(cuda::l2_prefetch(r, 0, 1 << 20, nullptr).is_ok());  // nothing asked
    EXPECT_TRUE(cuda::l2_prefetch(r, 2, 0, nullptr).is_ok());        // no budget
    EXPECT_TRUE(cuda::l2_prefetch(r, 2, 1 << 20, nullptr).is_ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
