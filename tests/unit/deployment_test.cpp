// Deployment files: what they turn into (planner input, launch commands) and how bad ones are
// refused (the message names the field).
#include <gtest/gtest.h>

#include "dist/deployment.h"

namespace ds41rt::dist {
namespace {

const char *GOOD = R"({
  "model": {"path": "/nowhere/DeepSeek-V4.1-Flash", "type": "deepseek_v41", "format": "exl3", "exl3_bits": 2},
  "coordinator": {"listen": "0.0.0.0:9000", "gpus": [{"device": 2, "budget": "32GiB"}]},
  "workers": [
    {"endpoint": "127.0.0.1:19441", "device": 1, "budget": "128GiB"},
    {"endpoint": "10.0.0.3:19441", "device": "cpu", "budget": 1000000000000}
  ],
  "context": 65536, "concurrency": 4, "prefill_batch": 256, "plan": "p.json"
})";

TEST(deployment, a_file_becomes_planner_input_and_commands) {
    auto d = parse_deployment(GOOD);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_EQ(d->input.format, expert_format::EXL3);
    EXPECT_EQ(d->input.config.n_layers, 40);  // built-in shapes: the path has no config.json here
    ASSERT_EQ(d->notes.size(), 1u);
    EXPECT_NE(d->notes[0].find("built-in full-size deepseek_v41"), std::string::npos);
    EXPECT_EQ(d->input.gpu_budgets, (std::vector<uint64_t>{32ull << 30}));
    EXPECT_EQ(d->gpu_devices, (std::vector<int>{2}));
    ASSERT_EQ(d->input.workers.size(), 2u);
    EXPECT_EQ(d->input.workers[0].budget, 128ull << 30);
    EXPECT_EQ(d->input.workers[1].device, -1);
    EXPECT_EQ(d->input.workers[1].budget, 1000000000000ull);
    EXPECT_EQ(d->input.load.concurrency, 4);

    auto p = place(d->input);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    auto cmds = launch_commands(*d, p->plan);
    ASSERT_EQ(cmds.size(), 3u);
    EXPECT_TRUE(cmds[0].local);
    EXPECT_EQ(cmds[0].line, "ds41rt worker --plan p.json --rank 0 --listen 127.0.0.1:19441 --model /nowhere/DeepSeek-V4.1-Flash");
    EXPECT_FALSE(cmds[1].local);
    EXPECT_EQ(cmds[1].host, "10.0.0.3");
    EXPECT_EQ(cmds[2].role, "coordinator");
    EXPECT_EQ(cmds[2].line, "CUDA_VISIBLE_DEVICES=2 ds41rt serve --model /nowhere/DeepSeek-V4.1-Flash --plan p.json "
                            "--host 0.0.0.0 --port 9000 --max-running 4 --max-context 65536");
    EXPECT_EQ(cmds[2].env, (std::vector<std::pair<std::string, std::string>>{{"CUDA_VISIBLE_DEVICES", "2"}}));
    EXPECT_EQ(cmds[2].argv.front(), "ds41rt");
    EXPECT_EQ(cmds[2].endpoint, "0.0.0.0:9000");
    EXPECT_EQ(cmds[0].endpoint, "127.0.0.1:19441");
    EXPECT_EQ(cmds[1].worker, 1);
    EXPECT_EQ(cmds[2].worker, -1);
}

// coordinator.args and the launcher's own extra options reach `serve`, in that order, and the
// printed line quotes what a shell would split.
TEST(deployment, serve_options_are_passed_and_quoted) {
    auto d = parse_deployment(R"({"model": {"type": "deepseek_v41"},
        "coordinator": {"listen": "127.0.0.1:8000", "cpu": true, "args": ["--tokenizer", "/a b/tok.json"]},
        "workers": [{"endpoint": "127.0.0.1:19441", "device": "cpu"}], "plan": "p.json"})");
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    auto p = place(d->input);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    auto cmds = launch_commands(*d, p->plan, {"--api-key", "it's"});
    const auto &argv = cmds.back().argv;
    ASSERT_GE(argv.size(), 4u);
    EXPECT_EQ(std::vector<std::string>(argv.end() - 4, argv.end()),
              (std::vector<std::string>{"--tokenizer", "/a b/tok.json", "--api-key", "it's"}));
    EXPECT_TRUE(cmds.back().env.empty());  // the CPU backend: no CUDA_VISIBLE_DEVICES
    const std::string &line = cmds.back().line;
    EXPECT_EQ(line.substr(line.size() - 47), "--tokenizer '/a b/tok.json' --api-key 'it'\\''s'");
    auto bad = parse_deployment(R"({"model": {"type": "deepseek_v41"}, "coordinator": {"cpu": true, "args": [1]}})");
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("coordinator.args[0] must be a string"), std::string::npos);
}

TEST(deployment, bad_files_name_the_field) {
    auto msg = [](const std::string &text) {
        auto d = parse_deployment(text);
        return d.is_ok() ? std::string("accepted") : d.status().message();
    };
    const std::string model = R"("model": {"type": "deepseek_v41"})";
    const std::string gpus = R"("coordinator": {"gpus": [{"device": 0}]})";
    EXPECT_NE(msg("{" + model + ", " + gpus + R"(, "contxt": 5})").find("contxt: unknown field"), std::string::npos);
    EXPECT_NE(msg("{" + model + R"(, "coordinator": {"gpus": [{"device": 0, "budget": "32 GB/s"}]}})")
                  .find("coordinator.gpus[0].budget: size '32 GB/s'"),
              std::string::npos);
    EXPECT_NE(msg("{" + model + ", " + gpus + R"(, "workers": [{"endpoint": "a:1"}, {"endpoint": "a:1"}]})")
                  .find("workers[1].endpoint a:1 is listed twice"),
              std::string::npos);
    EXPECT_NE(msg("{" + model + ", " + gpus + R"(, "workers": [{"endpoint": "hostonly"}]})").find("workers[0].endpoint"),
              std::string::npos);
    EXPECT_NE(msg("{" + model + ", " + gpus + R"(, "workers": [{"endpoint": "a:1", "device": "gpu"}]})")
                  .find("workers[0].device must be a CUDA device number or \"cpu\""),
              std::string::npos);
    EXPECT_NE(msg(R"({"model": {"path": "/nowhere"}, )" + gpus + "}").find("has no config.json"), std::string::npos);
    EXPECT_NE(msg("{" + model + R"(, "coordinator": {}})").find("coordinator.gpus is empty"), std::string::npos);
    EXPECT_NE(msg("{" + model + ", " + gpus + R"(, "concurrency": 0})").find("concurrency = 0 is outside"),
              std::string::npos);
    EXPECT_NE(msg("[]").find("must be an object"), std::string::npos);
}

// The NCCL transport: a top-level default, a worker's own key over it, carried into the plan
// (and so into plan.json and its version); NCCL workers are launched on their GPU with NVLink
// SHARP off; a bad value or a CPU worker on NCCL is refused naming the field.
TEST(deployment, transport_reaches_the_plan_and_the_worker_commands) {
    auto d = parse_deployment(R"({
      "model": {"type": "deepseek_v41"}, "coordinator": {"gpus": [{"device": 0, "budget": "32GiB"}]},
      "transport": "nccl",
      "workers": [{"endpoint": "127.0.0.1:19441", "device": 1, "budget": "140GiB"},
                  {"endpoint": "127.0.0.1:19442", "device": 1, "budget": "140GiB", "transport": "tcp"}],
      "tp": 1})");
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    ASSERT_EQ(d->input.workers.size(), 2u);
    EXPECT_EQ(d->input.workers[0].transport, "nccl");
    EXPECT_EQ(d->input.workers[1].transport, "tcp");
    auto p = place(d->input);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    EXPECT_EQ(p->plan.workers[0].transport, "nccl");
    EXPECT_EQ(p->plan.workers[1].transport, "tcp");
    EXPECT_TRUE(validate(p->plan));
    auto cmds = launch_commands(*d, p->plan);
    ASSERT_EQ(cmds.size(), 3u);
    EXPECT_EQ(cmds[0].line, "NCCL_NVLS_ENABLE=0 ds41rt worker --plan plan.json --rank 0 --listen 127.0.0.1:19441 "
                            "--model '<model path>' --device 1");
    EXPECT_EQ(cmds[1].line.find("--device"), std::string::npos);

    auto msg = [](const std::string &text) {
        auto r = parse_deployment(text);
        return r.is_ok() ? std::string("accepted") : r.status().message();
    };
    const std::string head = R"({"model": {"type": "deepseek_v41"}, "coordinator": {"gpus": [{"device": 0}]}, )";
    EXPECT_NE(msg(head + R"("transport": "rdma"})").find("transport: 'rdma'"), std::string::npos);
    EXPECT_NE(msg(head + R"("workers": [{"endpoint": "a:1", "transport": "ib"}]})").find("workers[0].transport: 'ib'"),
              std::string::npos);
    EXPECT_NE(msg(head + R"("workers": [{"endpoint": "a:1", "device": "cpu", "transport": "nccl"}]})")
                  .find("nccl needs a GPU worker"),
              std::string::npos);
}

TEST(deployment, loopback_endpoints_are_local) {
    EXPECT_TRUE(is_local_endpoint("127.0.0.1:19441"));
    EXPECT_TRUE(is_local_endpoint("localhost:1"));
    EXPECT_FALSE(is_local_endpoint("10.0.0.2:19441"));
    EXPECT_FALSE(is_local_endpoint("127.0.0.1"));
}

}  // namespace
}  // namespace ds41rt::dist
