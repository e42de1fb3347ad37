// experts/from_plan: a plan as the coordinator's engine runs it (remote layers' ranks and
// transports).
#include "experts/from_plan.h"

#include <gtest/gtest.h>

namespace ds41rt {
namespace {

dist::Plan four_layers() {
    dist::Plan p;
    p.model_type = "deepseek_v41";
    p.format = "official";
    p.num_layers = 4;
    p.coordinator.push_back({"gpu0", 0, {}});
    p.coordinator.push_back({"gpu1", 0, {}});
    p.workers.push_back({"127.0.0.1:19441", 1, {}, "nccl"});
    p.workers.push_back({"127.0.0.1:19442", -1, {}, "tcp"});
    p.layers.push_back({0, false, 0, {}});
    p.layers.push_back({1, false, 0, {}});
    p.layers.push_back({2, true, 0, {1, 0}});
    p.layers.push_back({3, true, 0, {0, 1}});
    return p;
}

TEST(from_plan, layout_keeps_ranks_transports_and_version) {
    const dist::Plan p = four_layers();
    const experts::remote_layout l = experts::layout_from_plan(p, 3000, 700);
    EXPECT_EQ(l.placement_version, p.version());
    ASSERT_EQ(l.workers.size(), 2u);
    EXPECT_EQ(l.workers[1], "127.0.0.1:19442");
    EXPECT_EQ(l.transports[0], experts::transport_kind::NCCL);
    EXPECT_EQ(l.transports[1], experts::transport_kind::TCP);
    ASSERT_EQ(l.layer_ranks.size(), 4u);
    EXPECT_TRUE(l.layer_ranks[0].empty());
    EXPECT_EQ(l.layer_ranks[2], (std::vector<int>{1, 0}));  // TP rank = position, not worker order
    EXPECT_EQ(l.timeout_ms, 3000);
    EXPECT_EQ(l.connect_timeout_ms, 700);
}

}  // namespace
}  // namespace ds41rt
