// The NCCL transport end to end on two GPUs: the GPU engine as coordinator on GPU 0, real
// `ds41rt worker --device 1` processes (the ds41rt next to this binary, or $DS41RT_BIN) holding
// TP2 slices of the tiny V4.1 fixture model (gpu_worker_test's: official storage, MXFP4 experts,
// intermediate 96, so TP2 cuts 64 + 32), both on GPU 1: two processes on one GPU stand for two
// hosts, each with its own 2-rank communicator with the coordinator.
//  - logits within 1e-5 (relative to the largest |logit|) of the same engine alone on GPU 0, and
//    the same greedy continuation: the TP2 partials sum each expert's intermediate channels in
//    two pieces (the slices) where the local kernels sum them at once, so fp32 rounding differs
//    in the last bits (gpu_worker_test measures ~1e-6 for the same split over TCP);
//  - the remote layers inside the captured step graphs give the bits of eager steps;
//  - faults, on replayed steps and on eager ones (DS41RT_NCCL_GRAPHS=0): a stalled worker
//    (SIGSTOP) makes the step UNAVAILABLE naming the layer within the layout's timeout; a worker
//    killed mid-request (SIGKILL while the request waits on it) makes it UNAVAILABLE well before
//    that timeout (its control channel closes); after the worker is restarted, service resumes
//    with the same logits;
//  - EXL3 experts (quantized_model.h's tiny EXL3 model, TP2 slices of 256 + 128): the workers run
//    them from host routes (gpu_experts brings the NCCL routes down first); logits within 1e-4
//    of the GPU engine alone on the tie-free prompt (the slices' trellis GEMVs sum each expert's
//    channels in two pieces: ~1e-6), the same greedy tokens;
//  - the exchange itself (experts/cuda/nccl_remote, no engine): a layer the worker does not hold
//    comes back as a non-zero status word, UNAVAILABLE naming the reason; the next request on a
//    held layer re-links and writes every element of the NaN-poisoned sum.
// Skips with a message without two GPUs. NCCL comes from the environment's libnccl.so.2.
#include <gtest/gtest.h>

#include <cuda_runtime.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dist/hello.h"
#include "dist/plan.h"
#include "dist/tcp_transport.h"
#include "engine/engine.h"
#include "experts/cuda/nccl_remote.h"
#include "experts/from_plan.h"
#include "model/synth.h"
#include "quantized_model.h"
#include "tie_free_prompt.h"
#include "tiny_synth.h"
#include "two_gpu_plan.h"

namespace ds41rt {
namespace {

namespace fs = std::filesystem;
using clk = std::chrono::steady_clock;

std::string worker_binary() {
    if (const char *b = std::getenv("DS41RT_BIN")) return b;
    return (fs::read_symlink("/proc/self/exe").parent_path() / "ds41rt").string();
}

int free_port() {
    auto l = dist::tcp_listener::listen("127.0.0.1:0");
    return l ? (*l)->port() : 0;
}

class NcclWorkers : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("ds41rt_nccl_worker_test_" + std::to_string(getpid()));
        fs::remove_all(dir_);
        model::synth_options o = tiny_synth();
        Status st = model::synthesize(dir_.string(), o);
        ASSERT_TRUE(st) << st.to_string();
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    void SetUp() override {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2)
            GTEST_SKIP() << "the NCCL worker test needs 2 GPUs (coordinator on GPU 0, workers on GPU 1); found " << n;
        if (!fs::exists(worker_binary())) GTEST_SKIP() << "no ds41rt binary at " << worker_binary() << " (set DS41RT_BIN)";
        for (int r = 0; r < 2; r++) ports_.push_back(free_port());
        plan_.model_type = "deepseek_v41";
        plan_.format = format_;
        plan_.num_layers = 12;
        plan_.coordinator.push_back({"gpu0", 0, {}});
        for (int port : ports_) plan_.workers.push_back({"127.0.0.1:" + std::to_string(port), 1, {}, "nccl"});
        for (int l = 0; l < 12; l++) {
            dist::LayerPlacement lp;
            lp.layer = l;
            if (l >= 2) lp.remote = true, lp.ranks = {0, 1};
            plan_.layers.push_back(lp);
        }
        plan_path_ = (dir_ / "plan.json").string();
        std::ofstream(plan_path_) << dist::to_json(plan_);
        for (int r = 0; r < 2; r++) start_worker(r);
        for (int r = 0; r < 2; r++) ASSERT_TRUE(wait_ready(r)) << "worker " << r << " did not come up; log " << log(r);
    }
    void TearDown() override {
        if (HasFailure())
            for (int r = 0; r < int(pids_.size()); r++) std::printf("%s", log_tail(r, 120).c_str());
        for (pid_t &p : pids_)
            if (p > 0) kill(p, SIGKILL), waitpid(p, nullptr, 0), p = 0;
    }

    std::string log(int r) const { return (dir_ / ("worker" + std::to_string(r) + ".log")).string(); }
    // Worker r's state and the last lines of its log, for failure messages (the directory goes
    // with the suite).
    std::string log_tail(int r, size_t lines = 20) {
        std::string state = "running";
        int ws = 0;
        if (size_t(r) < pids_.size() && pids_[size_t(r)] > 0 && waitpid(pids_[size_t(r)], &ws, WNOHANG) == pids_[size_t(r)]) {
            state = WIFSIGNALED(ws) ? "killed by signal " + std::to_string(WTERMSIG(ws)) : "exited " + std::to_string(WEXITSTATUS(ws));
            pids_[size_t(r)] = 0;
        }
        std::ifstream f(log(r));
        std::vector<std::string> all;
        for (std::string ln; std::getline(f, ln);) all.push_back(ln);
        std::string out = "\n--- worker " + std::to_string(r) + " " + state + "; " + log(r) + " (last lines) ---\n";
        for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); i++) out += all[i] + "\n";
        return out;
    }

    void start_worker(int r) {
        const std::string bin = worker_binary(), rank = std::to_string(r), lg = log(r);
        pid_t pid = fork();
        if (pid == 0) {
            int fd = ::open(lg.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) dup2(fd, 1), dup2(fd, 2);
            execl(bin.c_str(), bin.c_str(), "worker", "--model", dir_.c_str(), "--plan", plan_path_.c_str(), "--rank",
                  rank.c_str(), "--device", "1", static_cast<char *>(nullptr));
            _exit(127);
        }
        if (pids_.size() <= size_t(r)) pids_.resize(size_t(r) + 1, 0);
        pids_[size_t(r)] = pid;
    }
    // Up when it answers the handshake (the connection then ends; the engine opens its own).
    bool wait_ready(int r) {
        const auto until = clk::now() + std::chrono::seconds(60);
        while (clk::now() < until) {
            auto ch = dist::tcp_channel::connect(plan_.workers[size_t(r)].endpoint, dist::after_ms(500));
            if (ch && dist::hello(**ch, plan_.version(), uint32_t(r), dist::after_ms(2000))) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return false;
    }

    Result<std::unique_ptr<engine::engine>> open(bool remote, int timeout_ms) {
        engine::engine_options o;
        o.backend = engine::backend_kind::CUDA;
        if (remote) o.remote = experts::layout_from_plan(plan_, timeout_ms, 1000);
        return engine::engine::open(dir_.string(), o);
    }

    void stalled_and_killed_workers_fail_cleanly_and_service_resumes();

    static fs::path dir_;
    static std::string format_;  // the routed experts' format of the model in dir_
    std::vector<int> ports_;
    std::vector<pid_t> pids_;
    dist::Plan plan_;
    std::string plan_path_;
};
fs::path NcclWorkers::dir_;
std::string NcclWorkers::format_ = "official";

TEST_F(NcclWorkers, LogitsMatchTheSingleGpuRun) {
    std::vector<float> a, b;
    std::vector<int32_t> ga, gb;
    {
        auto e = open(false, 0);
        ASSERT_TRUE(e) << e.status().to_string();
        Status st = run_greedy(**e, 5, &a, &ga);
        ASSERT_TRUE(st) << st.to_string();
    }
    auto e = open(true, 10000);
    ASSERT_TRUE(e) << e.status().to_string();
    const auto t0 = clk::now();
    Status st = run_greedy(**e, 5, &b, &gb);
    ASSERT_TRUE(st) << st.to_string() << "; worker logs " << log(0) << ", " << log(1);
    const double secs = std::chrono::duration<double>(clk::now() - t0).count();
    ASSERT_EQ(a.size(), b.size());
    const double err = rel_max(a, b);
    std::printf("[ nccl worker ] GPU coordinator + 2 NCCL workers (TP2, both on GPU 1) vs the GPU engine alone: max "
                "|dlogit| / max |logit| = %.3g over %zu logits; 5 steps incl. link set-up %.2f s (info)\n",
                err, a.size(), secs);
    EXPECT_LE(err, 1e-5);
    EXPECT_EQ(ga, gb);
    // A second sequence on the live links: the steady state, timed for information.
    std::vector<float> c;
    std::vector<int32_t> gc;
    const auto t1 = clk::now();
    st = run_greedy(**e, 5, &c, &gc);
    ASSERT_TRUE(st) << st.to_string();
    std::printf("[ nccl worker ] 5 steps on live links (10 remote layers each): %.2f ms (info)\n",
                std::chrono::duration<double, std::milli>(clk::now() - t1).count());
    EXPECT_LE(rel_max(a, c), 1e-5);
    EXPECT_EQ(gc, gb);
}

// The remote layers inside the captured step graphs (headers staged by the host each step,
// faults watched at the step's synchronisation) against the same engine launching every kernel
// eagerly with a host wait per remote layer: the same bits.
TEST_F(NcclWorkers, GraphedStepsEqualEagerSteps) {
    auto e = open(true, 10000);
    ASSERT_TRUE(e) << e.status().to_string();
    std::vector<float> graphed, eager;
    std::vector<int32_t> gg, ge;
    Status st = run_greedy(**e, 5, &graphed, &gg);
    ASSERT_TRUE(st) << st.to_string();
    std::vector<float> again;
    std::vector<int32_t> ga;
    const auto t0 = clk::now();
    st = run_greedy(**e, 5, &again, &ga);  // every decode step of this run replays graphs
    ASSERT_TRUE(st) << st.to_string();
    const double graphed_ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
    (*e)->set_cuda_graphs(false);
    const auto t1 = clk::now();
    st = run_greedy(**e, 5, &eager, &ge);
    ASSERT_TRUE(st) << st.to_string();
    const double eager_ms = std::chrono::duration<double, std::milli>(clk::now() - t1).count();
    ASSERT_EQ(graphed.size(), eager.size());
    size_t differ = 0;
    for (size_t i = 0; i < graphed.size(); i++) differ += graphed[i] != eager[i] || again[i] != eager[i];
    std::printf("[ nccl worker ] NCCL layers in the graphs vs eager: %zu of %zu logits differ; 5 steps %.2f ms "
                "graphed, %.2f ms eager (info)\n",
                differ, graphed.size(), graphed_ms, eager_ms);
    EXPECT_EQ(differ, 0u);
    EXPECT_EQ(gg, ge);
    EXPECT_EQ(ga, ge);
}

// The fault cases, on the engine as it opens (DS41RT_NCCL_GRAPHS read then).
void NcclWorkers::stalled_and_killed_workers_fail_cleanly_and_service_resumes() {
    std::vector<float> ref;
    std::vector<int32_t> gref;
    {
        auto e = open(false, 0);
        ASSERT_TRUE(e) << e.status().to_string();
        ASSERT_TRUE(run_greedy(**e, 5, &ref, &gref));
    }
    const int timeout_ms = 3000;
    auto e = open(true, timeout_ms);
    ASSERT_TRUE(e) << e.status().to_string();
    {  // links up
        std::vector<float> l;
        std::vector<int32_t> g;
        Status st = run_greedy(**e, 5, &l, &g);
        ASSERT_TRUE(st) << st.to_string();
    }
    auto one_step = [&](Status *st, double *secs) {
        engine::seq_id s = (*e)->create_sequence();
        std::vector<Tensor> logits;
        const auto t0 = clk::now();
        *st = (*e)->step({{s, {0, 17, 300}}}, &logits);
        *secs = std::chrono::duration<double>(clk::now() - t0).count();
    };

    // Two clean steps of the row count the faults hit first (with graphs, one eager, one
    // captured: the faults then hit replayed steps).
    auto warm = [&] {
        for (int i = 0; i < 2; i++) {
            Status ok;
            double t = 0;
            one_step(&ok, &t);
            ASSERT_TRUE(ok) << ok.to_string();
        }
    };

    // Stall: worker 1 stops answering; the exchange times out and names it.
    warm();
    ASSERT_EQ(kill(pids_[1], SIGSTOP), 0);
    Status st;
    double secs = 0;
    one_step(&st, &secs);
    std::printf("[ nccl worker ] stalled worker: %s after %.2f s\n", st.to_string().c_str(), secs);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.code(), status_code::UNAVAILABLE);
    EXPECT_NE(st.message().find("layer 2"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("NCCL"), std::string::npos) << st.message();
    EXPECT_LT(secs, timeout_ms / 1000.0 + 6.0);  // the timeout, plus the stream's drain after the abort
    kill(pids_[1], SIGCONT);

    // Killed mid-request: worker 0 is stopped (so the request waits on it) and killed 300 ms in;
    // its control channel closes and the step fails long before the 3 s timeout.
    ASSERT_TRUE(wait_ready(1));  // worker 1 runs again (its old link was aborted)
    {
        std::vector<float> l;  // re-link both workers first
        std::vector<int32_t> g;
        Status ok = run_greedy(**e, 5, &l, &g);
        ASSERT_TRUE(ok) << ok.to_string() << log_tail(0) << log_tail(1);
    }
    warm();
    ASSERT_EQ(kill(pids_[0], SIGSTOP), 0);
    std::thread killer([pid = pids_[0]] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        kill(pid, SIGKILL);
    });
    one_step(&st, &secs);
    killer.join();
    waitpid(pids_[0], nullptr, 0);
    pids_[0] = 0;
    std::printf("[ nccl worker ] killed worker: %s after %.2f s\n", st.to_string().c_str(), secs);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.code(), status_code::UNAVAILABLE);
    EXPECT_NE(st.message().find("expert worker 0"), std::string::npos) << st.message();
    EXPECT_LT(secs, timeout_ms / 1000.0);

    // While it is down: a clean refusal (connection refused), no hang.
    one_step(&st, &secs);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.code(), status_code::UNAVAILABLE);
    EXPECT_LT(secs, timeout_ms / 1000.0 + 1.0);

    // Restarted: the coordinator re-bootstraps and serves the reference logits again.
    start_worker(0);
    ASSERT_TRUE(wait_ready(0)) << log(0);
    std::vector<float> after;
    std::vector<int32_t> gafter;
    st = run_greedy(**e, 5, &after, &gafter);
    ASSERT_TRUE(st) << st.to_string() << log_tail(0) << log_tail(1);
    ASSERT_EQ(after.size(), ref.size());
    const double err = rel_max(ref, after);
    std::printf("[ nccl worker ] after the restart: max |dlogit| / max |logit| = %.3g\n", err);
    EXPECT_LE(err, 1e-5);
    EXPECT_EQ(gafter, gref);
}

// Replayed steps (the default): a stalled worker resumed after the abort used to die of SIGSEGV
// in NCCL's reclaim (its stream and buffers were freed under it; nccl_link::hold_until_aborted).
TEST_F(NcclWorkers, StalledAndKilledWorkersFailCleanlyAndServiceResumes) {
    stalled_and_killed_workers_fail_cleanly_and_service_resumes();
}

TEST_F(NcclWorkers, StalledAndKilledWorkersFailCleanlyOnEagerSteps) {
    struct eager_env {
        eager_env() { setenv("DS41RT_NCCL_GRAPHS", "0", 1); }
        ~eager_env() { unsetenv("DS41RT_NCCL_GRAPHS"); }
    } env;
    stalled_and_killed_workers_fail_cleanly_and_service_resumes();
}

TEST_F(NcclWorkers, AStatusWordIsAnErrorNamingItsReason) {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    experts::remote_layout layout = experts::layout_from_plan(plan_, 5000, 1000);
    layout.layer_ranks[0] = {0, 1};  // layer 0 is local in the plan: the workers hold no slice of it
    const int64_t D = 64, rows = 3;
    const int K = 2;
    std::vector<float> x(static_cast<size_t>(rows * D)), w(static_cast<size_t>(rows * K), 0.25f);
    std::vector<int32_t> ids;
    for (int64_t r = 0; r < rows; r++) ids.push_back(int32_t(r % 4)), ids.push_back(int32_t(4 + r % 4));
    for (size_t i = 0; i < x.size(); i++) x[i] = float(std::sin(double(i)));
    void *xd = nullptr, *idd = nullptr, *wd = nullptr, *acc = nullptr;
    ASSERT_EQ(cudaMalloc(&xd, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&idd, ids.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&wd, w.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&acc, x.size() * 4), cudaSuccess);
    cudaMemcpy(xd, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(idd, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(wd, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    {
        experts::nccl_remote r(layout, D, 0);
        backend::cpu::expert_numerics nm;
        Status st = r.run(0, nm, static_cast<float *>(xd), static_cast<int32_t *>(idd), static_cast<float *>(wd),
                              rows, K, static_cast<float *>(acc), s);
        std::printf("[ nccl worker ] layer not held: %s\n", st.to_string().c_str());
        ASSERT_FALSE(st);
        EXPECT_EQ(st.code(), status_code::UNAVAILABLE);
        EXPECT_NE(st.message().find("layer 0"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("layer not held"), std::string::npos) << st.message();

        ASSERT_EQ(cudaMemset(acc, 0xff, x.size() * 4), cudaSuccess);  // NaN poison
        const auto t0 = clk::now();
        st = r.run(2, nm, static_cast<float *>(xd), static_cast<int32_t *>(idd), static_cast<float *>(wd), rows, K,
                       static_cast<float *>(acc), s);
        ASSERT_TRUE(st) << st.to_string();
        const double first_ms = std::chrono::duration<double, std::milli>(clk::now() - t0).count();
        std::vector<float> got(x.size());
        cudaMemcpy(got.data(), acc, got.size() * 4, cudaMemcpyDeviceToHost);
        double mx = 0;
        for (float v : got) {
            ASSERT_TRUE(std::isfinite(v)) << "an element of the sum was not written";
            mx = std::max(mx, double(std::fabs(v)));
        }
        EXPECT_GT(mx, 0.0);
        std::vector<double> us;
        for (int i = 0; i < 50; i++) {
            const auto t1 = clk::now();
            st = r.run(2, nm, static_cast<float *>(xd), static_cast<int32_t *>(idd), static_cast<float *>(wd), rows,
                           K, static_cast<float *>(acc), s);
                ASSERT_TRUE(st) << st.to_string();
            us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t1).count());
        }
        std::sort(us.begin(), us.end());
        std::printf("[ nccl worker ] re-link + first exchange %.1f ms; then TP2 round trip (3 rows) p50 %.1f us (info)\n",
                    first_ms, us[us.size() / 2]);
    }
    cudaStreamDestroy(s);
    for (void *p : {xd, idd, wd, acc}) cudaFree(p);
}

class NcclWorkersExl3 : public NcclWorkers {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("ds41rt_nccl_worker_exl3_" + std::to_string(getpid()));
        format_ = "exl3";
        make_quantized_model(dir_, "exl3");
    }
    static void TearDownTestSuite() {
        fs::remove_all(dir_);
        fs::remove_all(dir_.string() + "_src");
        format_ = "official";
    }
};

TEST_F(NcclWorkersExl3, LogitsMatchTheSingleGpuRun) {
    std::vector<float> logits[2];
    std::vector<int32_t> greedy[2];
    for (int remote = 0; remote < 2; remote++) {
        auto e = open(remote == 1, 10000);
        ASSERT_TRUE(e) << e.status().to_string();
        Status st = run_greedy(**e, 6, &logits[remote], &greedy[remote], TIE_FREE_PROMPT);
        ASSERT_TRUE(st) << st.to_string() << log_tail(0) << log_tail(1);
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    const double err = rel_max(logits[0], logits[1]);
    std::printf("[ nccl worker ] EXL3: GPU coordinator + 2 NCCL workers (TP2) vs the GPU engine alone: max |dlogit| / max "
                "|logit| = %.3g over %zu logits\n",
                err, logits[0].size());
    EXPECT_LE(err, 1e-4);
    EXPECT_EQ(greedy[0], greedy[1]);
}

}  // namespace
}  // namespace ds41rt
