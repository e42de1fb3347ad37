// The device-side grouping of one decode step's routes by expert (moe_routed's group kernel),
// as plain functions of the route list so the host can check them against plan_moe_decode's
// sort (tests/cuda/moe_routed_test.cpp, no GPU needed). Slots are ordered by (expert, route
// index), route index = row * K + k: exactly a stable sort on the expert, as plan_moe_decode
// does. Routes with id < 0 (dropped or not held) get no slot. O(R) per route, R <= 128.
#pragma once

#ifdef __CUDACC__
#define DS41RT_HOST_DEVICE __host__ __device__
#else
#define DS41RT_HOST_DEVICE
#endif

namespace ds41rt::backend::cuda {

// Phase one of route t (ids e[0..R)): its slot, its expert's first slot and route count, and
// whether t is the expert's first route (which then owns the expert's job).
struct route_group {
    int rank = 0, off = 0, rows = 0;
    bool first = true;
};

DS41RT_HOST_DEVICE inline route_group group_route(const int *e, int R, int t) {
    route_group g;
    const int mine = e[t];
    for (int r = 0; r < R; r++) {
        const int f = e[r];
        if (f < 0) continue;
        g.rank += f < mine || (f == mine && r < t);
        g.off += f < mine;
        if (f == mine) {
            g.rows++;
            g.first = g.first && !(r < t);
        }
    }
    return g;
}

// Phase two, given every route's phase one (first[r], rank[r]): the job index of t's expert
// (its place among the step's distinct experts, increasing id) and t's place in its row's slot
// list (increasing slot, which is increasing expert id).
struct route_place {
    int job = 0, pos = 0;
};

DS41RT_HOST_DEVICE inline route_place place_route(const int *e, const int *first, const int *rank, int R, int K, int t) {
    route_place p;
    const int mine = e[t], b = t / K;
    for (int r = 0; r < R; r++) p.job += first[r] && e[r] >= 0 && e[r] < mine;
    for (int r = b * K; r < (b + 1) * K; r++) p.pos += e[r] >= 0 && rank[r] < rank[t];
    return p;
}

}  // namespace ds41rt::backend::cuda

#undef DS41RT_HOST_DEVICE
