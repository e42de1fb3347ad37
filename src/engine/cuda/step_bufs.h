// The activations a GPU step hands from op to op, shared by the V4.1 and V4 forward passes:
// fresh stream-ordered temporaries in an eager step, or one fixed set per row count when the
// step's fixed-shape pieces replay CUDA graphs (step_graphs.h), whose nodes hold their addresses.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "engine/cuda/device_model.h"
#include "engine/cuda/step_graphs.h"

namespace ds41rt::engine::gpu {

struct step_bufs {
    int64_t S = 0;
    dtemp X, x, y;       // hc streams [S, hc, dim]; the collapsed row and a sublayer's output [S, dim]
    dtemp qr, q, kv, o;  // attention: [S, q_lora_rank], [S, H, hd], [S, hd], [S, H, hd]
    hc_mix_dev am, fm;   // the mHC mixes of the attention and FFN sites
    dtemp pre_mix;       // [S, hc] the first site's collapse weights, one-hot (V4.1; later sites read fm.pre)
    dtemp xs, sx;        // x's GEMV split (backend/cuda gemv_split) when S <= 16: [S, dim] E4M3, [dim / 32, 16]
    dtemp pos, ids;      // [S] positions (int64) and token ids (int32)
    dtemp erows, eids;   // V4.1 Engram: [S] hash rows (engram_hash_row) and the ids [layers, S, cols] (int64)
};

step_bufs make_step_bufs(const device_model &m, int64_t S);

// One row count's fixed buffers and graphs.
struct step_bucket {
    step_bufs b;
    step_graphs graphs;
    bool warm = false;    // one eager step ran with these buffers (the workspaces are sized)
    uint64_t ws_gen = 0;     // the GEMV workspace generation the graphs hold
    uint64_t links_gen = 0;  // the remote links' generation they hold (experts/cuda/nccl_remote)
    step_bucket(cudaStream_t s, std::shared_ptr<temp_arena> arena) : graphs(s, std::move(arena)) {}
};

// The buffers one step runs with and how it runs its fixed-shape pieces: with a bucket, its fixed
// buffers and graphs (captured once the bucket is warm); without, fresh buffers and eager pieces.
class step_frame {
public:
    step_frame(const device_model &m, step_bucket *bk, int64_t S)
        : bk_(bk), capture_(bk && bk->warm) {
        if (!bk_) fresh_ = make_step_bufs(m, S);
    }
    const step_bufs &bufs() const { return bk_ ? bk_->b : fresh_; }
    // The pieces are graphs this step (captured now or replayed), not eager launches.
    bool graphed() const { return capture_; }
    Status piece(size_t key, const std::function<Status()> &fn) {
        return bk_ ? bk_->graphs.run(key, capture_, fn) : fn();
    }
    // Every piece of the step has run: the bucket's workspaces are sized, later steps capture.
    void done() {
        if (bk_) bk_->warm = true;
    }

private:
    step_bucket *bk_;
    step_bufs fresh_;
    bool capture_;
};

// The buckets of one engine, by row count. A step of S rows gets S's bucket (made on first use)
// or nullptr: graphs off, or more rows than a decode step (max_rows). A bucket whose graphs hold
// a GEMV workspace since reallocated, or remote links since re-made (links_gen), drops them and
// runs eagerly once more.
class step_buckets {
public:
    step_bucket *get(const device_model &m, int64_t S, int64_t max_rows, uint64_t links_gen = 0);
    void set_on(bool on) {
        on_ = on;
        if (!on) by_rows_.clear();
    }

private:
    bool on_ = true;
    std::map<int64_t, std::unique_ptr<step_bucket>> by_rows_;
    std::shared_ptr<temp_arena> arena_;  // the captures' temporaries (temp_arena.h), made with the first bucket
};

}  // namespace ds41rt::engine::gpu
