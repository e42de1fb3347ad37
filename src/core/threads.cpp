#include "core/threads.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace ds41rt {

namespace {

class pool {
public:
    explicit pool(int n) : n_(n) {
        for (int i = 1; i < n_; i++) workers_.emplace_back([this, i] { loop(i); });
    }
    ~pool() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto &t : workers_) t.join();
    }
    int size() const { return n_; }

    void run(int64_t n, const std::function<void(int64_t, int64_t)> &fn, int64_t grain) {
        int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(1, grain));
        int chunks = int(std::min<int64_t>(n_, max_chunks));
        std::unique_lock<std::mutex> lk(mu_);
        // Nested calls, and a second thread while another's loop runs (an expert worker in the
        // coordinator's process, in tests), run serially in the caller.
        if (chunks <= 1 || in_run_) {
            lk.unlock();
            fn(0, n);
            return;
        }
        in_run_ = true;
        fn_ = &fn;
        n_items_ = n;
        chunks_ = chunks;
        pending_ = chunks - 1;
        gen_++;
        lk.unlock();
        cv_.notify_all();
        fn(0, n / chunks);  // chunk 0 on the caller
        lk.lock();
        done_cv_.wait(lk, [this] { return pending_ == 0; });
        in_run_ = false;
    }

private:
    void loop(int idx) {
        uint64_t seen = 0;
        for (;;) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return stop_ || gen_ != seen; });
            if (stop_) return;
            seen = gen_;
            if (idx >= chunks_) continue;
            const auto *fn = fn_;
            int64_t n = n_items_;
            int chunks = chunks_;
            lk.unlock();
            (*fn)(n * idx / chunks, n * (idx + 1) / chunks);
            lk.lock();
            if (--pending_ == 0) done_cv_.notify_one();
        }
    }

    int n_;
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_, done_cv_;
    bool stop_ = false;
    bool in_run_ = false;
    uint64_t gen_ = 0;
    const std::function<void(int64_t, int64_t)> *fn_ = nullptr;
    int64_t n_items_ = 0;
    int chunks_ = 0;
    int pending_ = 0;
};

pool &global_pool() {
    static pool p(thread_count());
    return p;
}

}  // namespace

int thread_count() {
    static int n = [] {
        if (const char *e = std::getenv("DS41RT_THREADS")) {
            int v = std::atoi(e);
            if (v > 0) return v;
        }
        return std::max(1, int(std::thread::hardware_concurrency()));
    }();
    return n;
}

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)> &fn, int64_t grain) {
    if (n <= 0) return;
    global_pool().run(n, fn, grain);
}

}  // namespace ds41rt
