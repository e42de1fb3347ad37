// Cost: n x k pointer writes (8 bytes each) and reads of idx / cnt: 16 x 512 x 12 bytes ~ 100 KB
// at a C16 decode step; fill_key_rows adds the window half (16 x 128 pointers): launch-latency
// bound, one launch a layer for up to 16 sequences.
// Test: tests/cuda/key_list_test.cpp (exact: pointers are integers).
#include "backend/cuda/key_list.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_status.h"

namespace ds41rt::backend::cuda {

namespace {

struct key_rows_params {
    key_row_seq seq[KEY_ROW_SEQS];
    int nseq;
    int64_t L, W, hd;
    bool tail;
};

// One block a row, threads across its columns.
__global__ void fill_key_rows_kernel(const float **keys, const __grid_constant__ key_rows_params P) {
    const int64_t r = P.seq[0].o + blockIdx.x;
    int i = 0;
    while (i + 1 < P.nseq && r >= P.seq[i + 1].o) i++;  // rows of the launch's sequences are contiguous
    const key_row_seq &q = P.seq[i];
    const int64_t s = r - q.o, p = q.p0 + s, first = max(int64_t(0), p - P.W + 1);
    const int64_t h0 = max(first, q.lo), nh = max(int64_t(0), q.p0 - h0);
    const int64_t c0 = max(first, q.p0), nc = p - c0 + 1;
    const bool window = q.ring.set() || q.chunk;
    const int64_t end = P.tail ? P.L : q.pad + q.k;
    const float **row = keys + r * P.L;
    for (int64_t j = threadIdx.x; j < end; j += blockDim.x) {
        const float *v = nullptr;
        if (j < q.pad) {
            if (!window) continue;
            if (j < nh) v = q.ring.at((h0 + j) % P.W);
            else if (j < nh + nc) v = q.chunk + (c0 + j - nh - q.p0) * P.hd;
        } else if (j < q.pad + q.k) {
            const int64_t c = j - q.pad;
            if (c < q.cnt[s]) v = q.entries.at(q.idx[s * q.k + c]);
        }
        row[j] = v;
    }
}

}  // namespace

Status fill_key_rows(const float **keys, int64_t L, const key_row_seq *seqs, int nseq, int64_t W, int64_t hd, bool tail,
                     cudaStream_t stream) {
    // A launch takes up to KEY_ROW_SEQS sequences whose rows follow one another.
    key_rows_params P{};
    P.L = L, P.W = W, P.hd = hd, P.tail = tail;
    int64_t rows = 0;
    auto launch = [&]() -> Status {
        if (P.nseq == 0) return Status::ok();
        fill_key_rows_kernel<<<unsigned(rows), 128, 0, stream>>>(keys, P);
        DS41RT_CUDA_RETURN_IF_ERROR(cudaGetLastError());
        P.nseq = 0, rows = 0;
        return Status::ok();
    };
    for (int i = 0; i < nseq; i++) {
        const key_row_seq &q = seqs[i];
        const bool window = q.ring.set() || q.chunk;
        if (q.n <= 0 || q.n > 65535 || q.o < 0 || q.pad < 0 || q.k < 0 || q.pad + q.k > L || (q.k > 0 && !(q.idx && q.cnt)) ||
            (window && (W <= 0 || q.pad < std::min(W, q.p0 + q.n) || q.lo < 0 || q.lo > q.p0)))
            return Status::invalid_argument("fill_key_rows: sequence " + std::to_string(i) + " (rows " + std::to_string(q.o) +
                                            " + " + std::to_string(q.n) + ", pad " + std::to_string(q.pad) + ", " +
                                            std::to_string(q.k) + " picks) in lists of " + std::to_string(L));
        if (P.nseq == KEY_ROW_SEQS || (P.nseq > 0 && q.o != P.seq[P.nseq - 1].o + P.seq[P.nseq - 1].n))
            DS41RT_RETURN_IF_ERROR(launch());
        P.seq[P.nseq++] = q;
        rows += q.n;
    }
    return launch();
}

}  // namespace ds41rt::backend::cuda
