// GPU sampling (semantics and exactness in sampling.cuh).
//
// Layout: a cluster of CLUSTER (8) blocks per row, grid (8, B); block q walks the row's q-th
// contiguous slice (~16,160 tokens at V = 129,280). Histograms, maxima and sums meet through
// distributed shared memory (integer sums, or fp64 partials combined in rank order), so every
// block takes the same decisions and the result does not depend on B or on other rows. At B = 16
// that is 128 blocks on 128 SMs instead of 16.
//
// Roofline, per row of V = 129,280 fp32 logits (517,120 B). Pass 0 reads the row from HBM (plus
// V/8 B of mask) and, unless the row is greedy without penalties, writes the masked row to the
// workspace (517 KB); later passes re-read the workspace, which stays in L2 (16 rows = 8.3 MB).
// Passes: greedy 1 (2 with penalties); stochastic 1 (+1), stats, then one radix select of
// ceil((32 + id_bits) / 9) = 6 passes for each of top_k, top_p and the draw (2 for an id-order
// draw); logprobs add 1 + 6 + 1. Once a filter (min_p, top_k, top_p) leaves <= 512 candidates,
// one more pass moves them to shared memory and the remaining selects cost microseconds. So per
// row ~1 MB of HBM traffic and up to ~9 MB of L2 reads (top_p alone over a wide nucleus).
// FLOPs: one fp64 exp per candidate per mass pass (~130 K exp a pass, ~40 fp64 ops each), the
// rest integer work (~15-30 instructions an element a pass). Per select pass a block also reads
// the cluster's 8 histograms (512 x 12 B each) over DSMEM and waits at two cluster barriers.
// Histogram updates are warp-aggregated (__match_any_sync): adjacent elements share a digit, and
// same-address shared atomics, 64-bit ones above all, serialised the single-block version.
// Nothing here is bound by the device: a pass costs one slice's L2 latency and issue rate
// (estimated 2-4 us plus ~2 us of barriers and DSMEM), so a top_p chain is ~13 passes.
#include "backend/cuda/sampling.cuh"

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <climits>
#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

namespace {

constexpr int THREADS = 512;  // 128 registers a thread: the select loops stay out of local memory
// 9 bits: one bucket a thread, and a pass reads 8 x 6 KB of remote histograms (11 bits cost 4x
// that over DSMEM and spilled registers, for one pass fewer per value select).
constexpr int RADIX_BITS = 9;
constexpr int BUCKETS = 1 << RADIX_BITS;
constexpr int BUCKETS_PER_THREAD = BUCKETS / THREADS;
static_assert(BUCKETS % THREADS == 0, "the scan gives each thread whole buckets");
constexpr float NEG_INF = -__builtin_huge_valf();
// Once a filter leaves at most this many candidates, they move into shared memory and the later
// selects walk them there instead of the whole row.
constexpr int LIST_CAP = 512;
// Blocks per row: a thread-block cluster of this many walks one row, each block a contiguous
// slice, and their histograms and partial sums meet through distributed shared memory. Fixed (not
// derived from B or the SM count) so a row's fp64 logprob sum has the same order in every batch;
// 8 is the portable cluster size every sm_90 part schedules.
constexpr int CLUSTER = 8;

namespace cg = cooperative_groups;

using u64 = unsigned long long;

__host__ __device__ int64_t padded(int V) { return (int64_t(V) + 3) / 4 * 4; }

// Order-preserving bits of a float; -0 and +0 compare equal on the CPU, so they map alike.
__device__ __forceinline__ uint32_t order_bits(float f) {
    const uint32_t b = f == 0.0f ? 0u : __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

struct cnt_mass {
    u64 cnt, mass;
};
struct add_cm {
    __device__ cnt_mass operator()(const cnt_mass &a, const cnt_mass &b) const { return {a.cnt + b.cnt, a.mass + b.mass}; }
};

struct max_op {
    template <class T> __device__ T operator()(const T &a, const T &b) const { return a < b ? b : a; }
};

using reduce_f = cub::BlockReduce<float, THREADS>;
using reduce_d = cub::BlockReduce<double, THREADS>;
using reduce_u = cub::BlockReduce<u64, THREADS>;
using scan_cm = cub::BlockScan<cnt_mass, THREADS>;

struct shared_t {
    uint32_t cnt[BUCKETS];
    u64 mass[BUCKETS];
    union {
        reduce_f::TempStorage rf;
        reduce_d::TempStorage rd;
        reduce_u::TempStorage ru;
        scan_cm::TempStorage scan;
    } tmp;
    int chosen, last;
    cnt_mass pick;  // the chosen bucket's exclusive and own sums, for every thread
    cnt_mass own;
    int nsel, nlist;
    float part_f;  // this block's partial of a cluster reduction, read by the others
    double part_d;
    u64 part_u, part_u2;
    u64 sel[SAMPLING_MAX_TOP_LOGPROBS];
    u64 list_key[LIST_CAP], list_mass[LIST_CAP];
};

// Calls f(i, x) for every element of a row, two float4 loads in flight per thread (eight blocks
// a row share the latency, and a deeper unroll spills registers).
template <class F> __device__ __forceinline__ void for_each_n(const float *row, int V, F &&f) {
    constexpr int U = 2;
    int done = 0;
    if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
        const float4 *r4 = reinterpret_cast<const float4 *>(row);
        const int n4 = V / 4;
        for (int base = threadIdx.x; base < n4; base += THREADS * U) {
            float4 v[U];
#pragma unroll
            for (int u = 0; u < U; u++)
                if (base + u * THREADS < n4) v[u] = r4[base + u * THREADS];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = base + u * THREADS;
                if (j < n4) {
                    f(4 * j, v[u].x);
                    f(4 * j + 1, v[u].y);
                    f(4 * j + 2, v[u].z);
                    f(4 * j + 3, v[u].w);
                }
            }
        }
        done = n4 * 4;
    }
    for (int base = done + int(threadIdx.x); base < V; base += THREADS * U) {
        float v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (base + u * THREADS < V) v[u] = row[base + u * THREADS];
#pragma unroll
        for (int u = 0; u < U; u++)
            if (base + u * THREADS < V) f(base + u * THREADS, v[u]);
    }
}

// The element views a select walks: each gives (candidate?, key) and, when asked, the mass.
struct value_view {  // sampling order: scaled value desc, id asc
    float inv_t, floor, m;
    int id_bits, fx_bits;
    __device__ float scaled(float x) const { return __fmul_rn(x, inv_t); }
    __device__ bool key(int i, float x, u64 &k) const {
        const float s = scaled(x);
        if (!(s >= floor && s > NEG_INF)) return false;
        k = (u64(order_bits(s)) << id_bits) | u64((1u << id_bits) - 1u - uint32_t(i));
        return true;
    }
    __device__ u64 mass(float x) const {
        return __double2ull_rn(exp(double(scaled(x)) - double(m)) * double(1ull << fx_bits));
    }
};
struct id_view : value_view {  // the same candidates walked in id order
    __device__ bool key(int i, float x, u64 &k) const {
        const float s = scaled(x);
        if (!(s >= floor && s > NEG_INF)) return false;
        k = u64((1u << id_bits) - 1u - uint32_t(i));
        return true;
    }
};
struct raw_view {  // raw logits, every token: the top_logprobs order
    int id_bits;
    __device__ bool key(int i, float x, u64 &k) const {
        k = (u64(order_bits(x)) << id_bits) | u64((1u << id_bits) - 1u - uint32_t(i));
        return true;
    }
    __device__ u64 mass(float) const { return 0; }
};

// The same over this block's slice [begin, end) of the row (begin is a multiple of 4, so an
// aligned row keeps its vector loads).
struct slice_t {
    int begin, end;
};
template <class F> __device__ __forceinline__ void for_each(const float *row, slice_t sl, F &&f) {
    for_each_n(row + sl.begin, sl.end - sl.begin, [&](int i, float x) { f(sl.begin + i, x); });
}

// What a select walks: visit(f) calls f(key, mass) for every candidate, mass() computed lazily.
template <class View> struct row_source {
    const float *row;
    slice_t sl;
    View view;
    template <class F> __device__ void visit(F &&f) const {
        for_each(row, sl, [&](int i, float x) {
            u64 k;
            if (view.key(i, x, k)) f(k, [&] { return view.mass(x); });
        });
    }
};
struct list_source {  // the compacted candidates (any order: the selects only sum integers)
    const shared_t *s;
    template <class F> __device__ void visit(F &&f) const {
        const int n = s->nlist < LIST_CAP ? s->nlist : LIST_CAP;
        for (int j = threadIdx.x; j < n; j += THREADS) f(s->list_key[j], [&] { return s->list_mass[j]; });
    }
};

// Exact sum of x over the lanes in peers (every one of them calls this with the same peers): three
// 32-bit reductions of 26-bit pieces, which cannot carry out of 32 bits for 32 lanes.
__device__ __forceinline__ u64 warp_sum(unsigned peers, u64 x) {
    constexpr u64 M = (1ull << 26) - 1;
    const u64 a = __reduce_add_sync(peers, unsigned(x & M));
    const u64 b = __reduce_add_sync(peers, unsigned((x >> 26) & M));
    const u64 c = __reduce_add_sync(peers, unsigned(x >> 52));
    return a + (b << 26) + (c << 52);
}

struct selected {
    u64 key;
    u64 cnt, mass;  // of the elements with key >= key (the selected one included)
};

// Walks the elements with key >= lo in descending key order and stops at the first whose running
// weight (1 each, or its fixed-point mass) reaches target; when none does, the last one.
// Radix select: RADIX_BITS of the key per pass, a count and mass histogram of the elements that
// share the digits chosen so far, a block scan over the buckets from the top.
template <class Source>
__device__ selected radix_select(shared_t &s, const cg::cluster_group &cl, const Source &src, int key_bits, u64 lo, bool by_mass, bool with_mass,
                                 u64 target) {
    u64 prefix = 0, above_cnt = 0, above_mass = 0;
    selected out{0, 0, 0};
    for (int bits_left = key_bits; bits_left > 0;) {
        const int w = bits_left < RADIX_BITS ? bits_left : RADIX_BITS;
        const int shift = bits_left - w;
        for (int b = threadIdx.x; b < BUCKETS; b += THREADS) {
            s.cnt[b] = 0;
            s.mass[b] = 0;
        }
        if (threadIdx.x == 0) {
            s.chosen = INT_MAX;
            s.last = -1;
        }
        __syncthreads();
        const u64 want = prefix >> bits_left;
        src.visit([&](u64 k, const auto &mass) {
            if (k < lo || (k >> bits_left) != want) return;
            const int d = int((k >> shift) & u64((1 << w) - 1));
            // Neighbouring elements mostly share a digit (adjacent ids, or floats of one
            // exponent), so the lanes that do combine first and one of them adds for all.
            const unsigned peers = __match_any_sync(__activemask(), d);
            u64 ms = 0;
            if (with_mass) ms = warp_sum(peers, mass());
            if (int(threadIdx.x & 31) == __ffs(peers) - 1) {
                atomicAdd(&s.cnt[d], unsigned(__popc(peers)));
                if (with_mass) atomicAdd(&s.mass[d], ms);
            }
        });
        cl.sync();  // every block of the row has its slice's histogram
        // Descending bucket order: thread t holds positions t*BPT.. of the walk. Each bucket is
        // the integer sum of the cluster's histograms, so all blocks see the same totals.
        cnt_mass items[BUCKETS_PER_THREAD], excl[BUCKETS_PER_THREAD];
#pragma unroll
        for (int j = 0; j < BUCKETS_PER_THREAD; j++) items[j] = {0, 0};
        for (int q = 0; q < CLUSTER; q++) {
            const shared_t *rs = cl.map_shared_rank(&s, q);
#pragma unroll
            for (int j = 0; j < BUCKETS_PER_THREAD; j++) {
                const int d = BUCKETS - 1 - (int(threadIdx.x) * BUCKETS_PER_THREAD + j);
                items[j].cnt += rs->cnt[d];
                items[j].mass += rs->mass[d];
            }
        }
        cl.sync();  // the others are done reading this block's histogram
        scan_cm(s.tmp.scan).ExclusiveScan(items, excl, cnt_mass{0, 0}, add_cm{});
#pragma unroll
        for (int j = 0; j < BUCKETS_PER_THREAD; j++) {
            if (items[j].cnt == 0) continue;
            const int pos = int(threadIdx.x) * BUCKETS_PER_THREAD + j;
            const u64 reach = by_mass ? above_mass + excl[j].mass + items[j].mass : above_cnt + excl[j].cnt + items[j].cnt;
            if (reach >= target) atomicMin(&s.chosen, pos);
            atomicMax(&s.last, pos);
        }
        __syncthreads();
        const int pos = s.chosen != INT_MAX ? s.chosen : s.last;
        if (pos < 0) return out;  // no element at all (the caller never asks for an empty set)
#pragma unroll
        for (int j = 0; j < BUCKETS_PER_THREAD; j++)  // static indices keep items/excl in registers
            if (int(threadIdx.x) * BUCKETS_PER_THREAD + j == pos) {
                s.pick = excl[j];
                s.own = items[j];
            }
        __syncthreads();
        above_cnt += s.pick.cnt;
        above_mass += s.pick.mass;
        out.cnt = above_cnt + s.own.cnt;
        out.mass = above_mass + s.own.mass;
        prefix |= u64(BUCKETS - 1 - pos) << shift;
        bits_left = shift;
        __syncthreads();  // before the next pass clears the histogram and s.pick
    }
    out.key = prefix;
    return out;
}

// Cluster-wide reductions: each block reduces its slice, then every block combines the CLUSTER
// partials in rank order (so even the fp64 sum is the same in every block and every batch).
__device__ float cluster_max(shared_t &s, const cg::cluster_group &cl, float x) {
    x = reduce_f(s.tmp.rf).Reduce(x, max_op{});
    if (threadIdx.x == 0) s.part_f = x;
    cl.sync();
    float m = -__builtin_huge_valf();
    for (int q = 0; q < CLUSTER; q++) m = fmaxf(m, *cl.map_shared_rank(&s.part_f, q));
    cl.sync();
    return m;
}
__device__ u64 cluster_max_u(shared_t &s, const cg::cluster_group &cl, u64 x) {
    x = reduce_u(s.tmp.ru).Reduce(x, max_op{});
    if (threadIdx.x == 0) s.part_u = x;
    cl.sync();
    u64 m = 0;
    for (int q = 0; q < CLUSTER; q++) {
        const u64 y = *cl.map_shared_rank(&s.part_u, q);
        m = y > m ? y : m;
    }
    cl.sync();
    return m;
}
__device__ void cluster_sum2_u(shared_t &s, const cg::cluster_group &cl, u64 &a, u64 &b) {
    a = reduce_u(s.tmp.ru).Sum(a);
    __syncthreads();
    b = reduce_u(s.tmp.ru).Sum(b);
    if (threadIdx.x == 0) {
        s.part_u = a;
        s.part_u2 = b;
    }
    cl.sync();
    a = 0;
    b = 0;
    for (int q = 0; q < CLUSTER; q++) {
        a += *cl.map_shared_rank(&s.part_u, q);
        b += *cl.map_shared_rank(&s.part_u2, q);
    }
    cl.sync();
}
__device__ double cluster_sum_d(shared_t &s, const cg::cluster_group &cl, double x) {
    x = reduce_d(s.tmp.rd).Sum(x);
    if (threadIdx.x == 0) s.part_d = x;
    cl.sync();
    double t = 0;
    for (int q = 0; q < CLUSTER; q++) t += *cl.map_shared_rank(&s.part_d, q);
    cl.sync();
    return t;
}

__device__ int32_t id_of(u64 key, int id_bits) {
    const uint32_t m = (1u << id_bits) - 1u;
    return int32_t(m - uint32_t(key & m));
}

__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, 1)
    sample_kernel(sampling_batch b, int id_bits) {
    __shared__ shared_t s;
    const cg::cluster_group cl = cg::this_cluster();
    const int rank = int(cl.block_rank());
    const int r = blockIdx.y;
    const sampling_row rp = b.rows[r];
    const cpu::row_sampling &p = rp.p;
    const int V = b.V;
    const float *logits = b.logits + int64_t(r) * b.ld;
    float *work = static_cast<float *>(b.workspace) + int64_t(r) * padded(V);
    const uint32_t *mask = rp.has_mask ? b.allowed + int64_t(r) * b.mask_words : nullptr;
    const int covered = mask ? (int64_t(b.mask_words) * 32 < V ? b.mask_words * 32 : V) : V;
    // This block's slice of the row; everything per element below touches only the slice.
    const int chunk = ((V + CLUSTER - 1) / CLUSTER + 3) / 4 * 4;
    const int sb = rank * chunk < V ? rank * chunk : V;
    const slice_t sl{sb, sb + chunk < V ? sb + chunk : V};

    // Pass 0: mask, and the raw max the logprobs need. Without penalties it also finds the greedy
    // key or the scaled max, and a greedy row never writes the workspace.
    const bool penalize = (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && rp.counts_len > 0;
    const raw_view rv{id_bits};
    value_view v{p.inv_temperature, NEG_INF, 0.0f, id_bits, 63 - id_bits};
    const bool write_work = !p.greedy || penalize;
    float raw_max = NEG_INF, m = NEG_INF;
    u64 best = 0;
    for_each(logits, sl, [&](int i, float x) {
        raw_max = fmaxf(raw_max, x);
        if (mask && (i >= covered || !((mask[i >> 5] >> (i & 31)) & 1u))) x = NEG_INF;
        if (write_work) work[i] = x;
        if (p.greedy) {
            u64 k;
            rv.key(i, x, k);
            best = k > best ? k : best;
        } else {
            m = fmaxf(m, v.scaled(x));
        }
    });
    __syncthreads();
    if (penalize) {
        for (int j = threadIdx.x; j < rp.counts_len; j += THREADS) {
            const cpu::token_count tc = b.counts[rp.counts_begin + j];
            if (tc.token >= sl.begin && tc.token < sl.end)
                work[tc.token] = __fsub_rn(work[tc.token], __fadd_rn(__fmul_rn(float(tc.count), p.frequency_penalty),
                                                                      p.presence_penalty));
        }
        __syncthreads();
        best = 0;
        m = NEG_INF;
        for_each(work, sl, [&](int i, float x) {
            if (p.greedy) {
                u64 k;
                rv.key(i, x, k);
                best = k > best ? k : best;
            } else {
                m = fmaxf(m, v.scaled(x));
            }
        });
    }

    int32_t chosen = 0;
    if (p.greedy) {
        chosen = id_of(cluster_max_u(s, cl, best), id_bits);
    } else {
        m = cluster_max(s, cl, m);
        if (m == NEG_INF) {
            chosen = 0;  // everything masked: the CPU's argmax of an all -inf row
        } else {
            v.m = m;
            v.floor = p.log_min_p > NEG_INF ? __fadd_rn(m, p.log_min_p) : NEG_INF;
            u64 cnt = 0, mass = 0;
            for_each(work, sl, [&](int i, float x) {
                u64 k;
                if (v.key(i, x, k)) {
                    cnt++;
                    mass += v.mass(x);
                }
            });
            cluster_sum2_u(s, cl, cnt, mass);
            u64 total = mass;
            const int key_bits = 32 + id_bits;
            const row_source<value_view> row_src{work, sl, v};
            const list_source list_src{&s};
            bool listed = false;
            // Moves the candidates with key >= from (n of them in the row, n <= LIST_CAP) to
            // shared memory: each block keeps the ones of its slice.
            auto to_list = [&](u64 from) {
                if (threadIdx.x == 0) s.nlist = 0;
                __syncthreads();
                row_src.visit([&](u64 k, const auto &mass) {
                    if (k < from) return;
                    const int slot = atomicAdd(&s.nlist, 1);
                    if (slot < LIST_CAP) {
                        s.list_key[slot] = k;
                        s.list_mass[slot] = mass();
                    }
                });
                __syncthreads();
                listed = true;
            };
            auto select = [&](u64 from, bool by_mass, u64 target) {
                return listed ? radix_select(s, cl, list_src, key_bits, from, by_mass, true, target)
                              : radix_select(s, cl, row_src, key_bits, from, by_mass, true, target);
            };
            u64 lo = 0;
            const bool use_k = p.top_k > 0 && u64(p.top_k) < cnt;
            const bool use_p = p.top_p < 1.0f;
            if ((use_k || use_p) && cnt <= u64(LIST_CAP)) to_list(0);
            if (use_k) {
                const selected k = select(0, false, u64(p.top_k));
                lo = k.key;
                total = k.mass;
                if (!listed && p.top_k <= LIST_CAP) to_list(lo);
            }
            if (use_p) {
                double t = ceil(double(p.top_p) * double(total));
                const u64 target = t >= double(total) ? total : u64(t);
                const selected k = select(lo, true, target);
                lo = k.key;
                total = k.mass;
                if (!listed && k.cnt <= u64(LIST_CAP)) to_list(lo);
            }
            // The draw: the first candidate whose running mass exceeds u * total, i.e. reaches
            // floor(bits * total / 2^53) + 1 (exact in 128-bit integers).
            const u64 bits = cpu::sampling_uniform_bits(rp.seed, rp.position);
            const u64 hi = __umul64hi(bits, total), lo64 = bits * total;
            const u64 target = ((hi << 11) | (lo64 >> 53)) + 1;
            if (use_k || use_p) {
                chosen = id_of(select(lo, true, target).key, id_bits);
            } else {
                id_view iv;
                static_cast<value_view &>(iv) = v;
                const row_source<id_view> id_src{work, sl, iv};
                chosen = id_of(radix_select(s, cl, id_src, id_bits, 0, true, true, target).key, id_bits);
            }
        }
    }
    if (rank == 0 && threadIdx.x == 0) b.tokens[r] = chosen;
    if (!rp.logprobs || (!b.logprob && !b.top_ids)) return;

    // Raw logprobs: log_softmax of the logits as produced (fp64 log-sum-exp, as the CPU).
    const float rm = cluster_max(s, cl, raw_max);
    double sum = 0;
    for_each(logits, sl, [&](int, float x) { sum += exp(double(x) - double(rm)); });
    sum = cluster_sum_d(s, cl, sum);
    const double lse = double(rm) + log(sum);
    if (rank == 0 && threadIdx.x == 0 && b.logprob) b.logprob[r] = float(double(logits[chosen]) - lse);
    if (!b.top_ids) return;
    int k = rp.top_logprobs < 0 ? 0 : rp.top_logprobs;
    k = k > SAMPLING_MAX_TOP_LOGPROBS ? SAMPLING_MAX_TOP_LOGPROBS : k;
    k = k > V ? V : k;
    if (k > 0) {
        const row_source<raw_view> raw_src{logits, sl, rv};
        const u64 kth = radix_select(s, cl, raw_src, 32 + id_bits, 0, false, false, u64(k)).key;
        if (threadIdx.x == 0) s.nsel = 0;
        __syncthreads();
        for_each(logits, sl, [&](int i, float x) {
            u64 key;
            rv.key(i, x, key);
            if (key >= kth) s.sel[atomicAdd(&s.nsel, 1)] = key;  // k in the row: keys are unique
        });
        cl.sync();
        if (rank == 0 && threadIdx.x == 0) {  // gather the other slices' picks after its own
            int n = s.nsel;
            for (int q = 1; q < CLUSTER; q++) {
                const shared_t *rs = cl.map_shared_rank(&s, q);
                for (int j = 0; j < rs->nsel && n < SAMPLING_MAX_TOP_LOGPROBS; j++) s.sel[n++] = rs->sel[j];
            }
        }
        cl.sync();  // no block leaves while rank 0 reads its picks
    }
    if (rank == 0 && threadIdx.x == 0) {
        for (int i = 1; i < k; i++)  // at most 20: insertion sort, descending
            for (int j = i; j > 0 && s.sel[j] > s.sel[j - 1]; j--) {
                const u64 t = s.sel[j];
                s.sel[j] = s.sel[j - 1];
                s.sel[j - 1] = t;
            }
        for (int i = 0; i < SAMPLING_MAX_TOP_LOGPROBS; i++) {
            const int id = i < k ? id_of(s.sel[i], id_bits) : -1;
            b.top_ids[int64_t(r) * SAMPLING_MAX_TOP_LOGPROBS + i] = id;
            if (b.top_logprobs)
                b.top_logprobs[int64_t(r) * SAMPLING_MAX_TOP_LOGPROBS + i] =
                    id >= 0 ? float(double(logits[id]) - lse) : NEG_INF;
        }
    }
}

}  // namespace

size_t sampling_workspace_bytes(int B, int V) { return size_t(B) * size_t(padded(V)) * sizeof(float); }

Status run_sampling(const sampling_batch &b, cudaStream_t stream) {
    if (b.B <= 0) return Status::ok();
    if (b.V <= 0 || b.V > (1 << 30) || b.ld < b.V)
        return Status::invalid_argument("sampling: V must be in [1, 2^30] and ld >= V (V " + std::to_string(b.V) +
                                        ", ld " + std::to_string(b.ld) + ")");
    if (!b.logits || !b.rows || !b.workspace || !b.tokens)
        return Status::invalid_argument("sampling: logits, rows, workspace and tokens are required");
    if (b.allowed && b.mask_words <= 0) return Status::invalid_argument("sampling: allowed needs mask_words > 0");
    int id_bits = 1;
    while ((int64_t(1) << id_bits) < b.V) id_bits++;
    if (b.B > 65535) return Status::invalid_argument("sampling: B must be <= 65535 (B " + std::to_string(b.B) + ")");
    sample_kernel<<<dim3(CLUSTER, b.B), THREADS, 0, stream>>>(b, id_bits);
    DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::ok();
}

}  // namespace ds41rt::backend::cuda
