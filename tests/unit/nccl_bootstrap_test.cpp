// The NCCL bootstrap on a real worker's control channel (loopback TCP, a worker thread with its
// slices on the CPU): a bootstrap from another plan is refused as stale, one for another worker
// index is refused, and a CPU worker refuses the NCCL transport itself (it has no GPU slices)
// with an ERROR naming why; none of these hangs. Also: a plan's transports reach the experts
// room's layout (a layer is NCCL only when all its ranks are).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "dist/hello.h"
#include "dist/nccl_wire.h"
#include "dist/plan.h"
#include "dist/tcp_transport.h"
#include "dist/worker.h"
#include "experts/from_plan.h"
#include "model/synth.h"
#include "tiny_synth.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;

dist::Plan tiny_plan(int port) {
    dist::Plan p;
    p.model_type = "deepseek_v41";
    p.format = "official";
    p.num_layers = 12;
    p.coordinator.push_back({"cpu", 0, {}});
    p.workers.push_back({"127.0.0.1:" + std::to_string(port), -1, {}});
    for (int l = 0; l < 12; l++) {
        dist::LayerPlacement lp;
        lp.layer = l;
        if (l >= 10) lp.remote = true, lp.ranks = {0};
        p.layers.push_back(lp);
    }
    return p;
}

TEST(NcclBootstrap, WorkerRefusesStaleForeignAndCpuBootstraps) {
    const fs::path dir = fs::temp_directory_path() / ("ds41rt_nccl_bootstrap_test_" + std::to_string(getpid()));
    fs::remove_all(dir);
    model::synth_options o = tiny_synth();
    ASSERT_TRUE(model::synthesize(dir.string(), o));
    auto l = dist::tcp_listener::listen("127.0.0.1:0");
    ASSERT_TRUE(l) << l.status().to_string();
    const dist::Plan plan = tiny_plan((*l)->port());
    auto w = dist::expert_worker::load(dir.string(), plan, 0);
    ASSERT_TRUE(w) << w.status().to_string();
    std::atomic<bool> stop{false};
    std::thread t([&] { (void)(*w)->serve(**l, stop); });

    auto bootstrap = [&](uint64_t version, uint32_t executor) -> Status {
        auto ch = dist::tcp_channel::connect(plan.workers[0].endpoint, dist::after_ms(2000));
        if (!ch) return ch.status();
        Status st = dist::hello(**ch, plan.version(), 0, dist::after_ms(2000));
        if (!st) return st;
        dist::nccl_bootstrap b;
        b.placement_version = version;
        b.executor = executor;
        DS41RT_RETURN_IF_ERROR((*ch)->send(dist::encode_nccl_bootstrap(b), dist::after_ms(2000)));
        auto reply = (*ch)->recv(dist::after_ms(5000));
        if (!reply) return reply.status();
        auto h = dist::decode_frame(*reply);
        if (!h) return h.status();
        if (h->kind == dist::frame_kind::ERROR) return dist::decode_error(*reply);
        return Status::ok();
    };
    const auto t0 = std::chrono::steady_clock::now();
    Status stale = bootstrap(plan.version() + 1, 0);
    ASSERT_FALSE(stale);
    EXPECT_NE(stale.message().find("stale placement version"), std::string::npos) << stale.to_string();
    Status foreign = bootstrap(plan.version(), 5);
    ASSERT_FALSE(foreign);
    EXPECT_NE(foreign.message().find("for worker 5"), std::string::npos) << foreign.to_string();
    Status cpu = bootstrap(plan.version(), 0);
    ASSERT_FALSE(cpu);
    EXPECT_NE(cpu.message().find("NCCL transport"), std::string::npos) << cpu.to_string();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    // The worker still answers HELLO afterwards.
    auto ch = dist::tcp_channel::connect(plan.workers[0].endpoint, dist::after_ms(2000));
    ASSERT_TRUE(ch);
    EXPECT_TRUE(dist::hello(**ch, plan.version(), 0, dist::after_ms(2000)));
    stop = true;
    t.join();
    fs::remove_all(dir);
}

TEST(NcclBootstrap, LayoutTakesThePlansTransports) {
    dist::Plan p = tiny_plan(9000);
    p.workers.push_back({"127.0.0.1:9001", 0, {}, "nccl"});
    p.workers[0].device = 0;
    p.workers[0].transport = "nccl";
    p.layers[10].ranks = {0, 1};
    p.layers[11].ranks = {1};
    experts::remote_layout l = experts::layout_from_plan(p, 1000, 500);
    EXPECT_TRUE(l.layer_nccl(10));
    EXPECT_TRUE(l.layer_nccl(11));
    EXPECT_FALSE(l.layer_nccl(3));  // local
    p.workers[0].transport = "tcp";
    l = experts::layout_from_plan(p, 1000, 500);
    EXPECT_FALSE(l.layer_nccl(10));
    EXPECT_TRUE(l.layer_nccl(11));
    EXPECT_EQ(l.transport(0), experts::transport_kind::TCP);
    EXPECT_EQ(l.transport(7), experts::transport_kind::TCP);  // beyond the list: TCP
    // validate() refuses a layer whose ranks mix transports.
    Status st = dist::validate(p);
    ASSERT_FALSE(st);
    EXPECT_NE(st.message().find("mix transports"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace ds41rt
