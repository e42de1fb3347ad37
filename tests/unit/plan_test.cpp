#include "dist/plan.h"

#include <gtest/gtest.h>

using namespace ds41rt;
using namespace ds41rt::dist;

namespace {

std::vector<int> widths(int width, int tp, int align) {
    std::vector<int> w;
    int next = 0;
    for (int r = 0; r < tp; ++r) {
        auto s = tp_slice(width, tp, r, align);
        EXPECT_TRUE(s.is_ok()) << s.status().to_string();
        EXPECT_EQ(s->begin, next) << "slices must tile the width in rank order";
        next = s->end;
        w.push_back(s->width());
    }
    EXPECT_EQ(next, width);
    return w;
}

Plan two_layer_plan() {
    Plan p;
    p.model_type = "deepseek_v41";
    p.format = "official";
    p.num_layers = 2;
    p.coordinator.push_back({"gpu0", 1000, {{"weights.dense", 600}}});
    p.workers.push_back({"127.0.0.1:19441", -1, {"worker0", 0, {}}});
    p.workers.push_back({"127.0.0.1:19442", -1, {"worker1", 0, {}}});
    p.layers.push_back({0, false, 0, {}});
    p.layers.push_back({1, true, 0, {0, 1}});
    return p;
}

}  // namespace

// Widths from ../shared/specs/reference-system.md 1.3: the expert intermediate 2304 split
// 1152 / 768 / 576 / 384 for TP2/3/4/6, and EXL3's 128-aligned TP4 split 640/640/512/512.
TEST(plan, tp_slices_match_the_reference_layouts) {
    EXPECT_EQ(widths(2304, 2, 32), (std::vector<int>{1152, 1152}));
    EXPECT_EQ(widths(2304, 3, 32), (std::vector<int>{768, 768, 768}));
    EXPECT_EQ(widths(2304, 4, 32), (std::vector<int>{576, 576, 576, 576}));
    EXPECT_EQ(widths(2304, 6, 32), (std::vector<int>{384, 384, 384, 384, 384, 384}));
    EXPECT_EQ(widths(2304, 4, 128), (std::vector<int>{640, 640, 512, 512}));
    EXPECT_EQ(widths(2304, 3, 128), (std::vector<int>{768, 768, 768}));
}

TEST(plan, tp_slice_refuses_what_cannot_be_split) {
    EXPECT_FALSE(tp_slice(100, 2, 0, 32).is_ok());  // not whole blocks
    EXPECT_FALSE(tp_slice(64, 3, 0, 32).is_ok());   // a rank would get nothing
    EXPECT_FALSE(tp_slice(64, 2, 2, 32).is_ok());   // no such rank
}

TEST(plan, json_round_trip_keeps_content_and_version) {
    Plan p = two_layer_plan();
    auto q = parse_plan(to_json(p));
    ASSERT_TRUE(q.is_ok()) << q.status().to_string();
    EXPECT_EQ(to_json(*q), to_json(p));
    EXPECT_EQ(q->version(), p.version());
    EXPECT_EQ(q->layers[1].tp(), 2);
}

TEST(plan, version_tracks_placement_not_charges) {
    Plan p = two_layer_plan();
    Plan charged = p;
    charged.coordinator[0].charges["kv"] = 100;
    EXPECT_EQ(charged.version(), p.version());
    Plan moved = p;
    moved.layers[1].ranks = {1, 0};
    EXPECT_NE(moved.version(), p.version());
}

TEST(plan, bad_plans_are_refused_with_the_field) {
    Plan p = two_layer_plan();
    p.layers[1].ranks = {0, 2};
    EXPECT_NE(validate(p).message().find("rank 2 is not a worker"), std::string::npos);
    p = two_layer_plan();
    p.coordinator[0].charges["kv"] = 500;
    EXPECT_NE(validate(p).message().find("gpu0 is charged 1100"), std::string::npos);
    std::string text = to_json(two_layer_plan());
    text.replace(text.find("\"ranks\""), 7, "\"rankz\"");
    auto r = parse_plan(text);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("plan.layers[1].ranks"), std::string::npos);
    std::string edited = to_json(two_layer_plan());
    edited.replace(edited.find("19442"), 5, "19443");
    EXPECT_NE(parse_plan(edited).status().message().find("does not match its content"), std::string::npos);
}
