// Tokenizer throughput on the committed corpus (tests/fixtures/tokenizer/corpus.bin): load time,
// encode MB/s on the first pass (empty word cache) and on later passes (warm cache), encode with
// two threads, and decode MB/s. Not a test; docs/perf/2026-11-30-tokenizer.md has the numbers and
// tools/reference/tokenizer_bench_hf.py measures HF tokenizers on the same documents.
//
//   build-text/tokenizer_bench [--vocab PATH] [--repeat N]
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "text/tokenizer.h"
#include "../unit/vocab_path.h"

namespace {

namespace fs = std::filesystem;
using ds41rt::text::tokenizer;

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of the calling thread: on a shared 2-core machine, wall time also counts the time
// other processes held the core, so single-thread rates are reported from this as well.
double thread_cpu_s() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The valid-UTF-8 documents (kind 0) of corpus.bin, the ones HF can encode too.
std::vector<std::string> load_docs(const fs::path &path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    std::string c = ss.str();
    std::vector<std::string> docs;
    if (c.size() < 12 || c.compare(0, 8, "DSTKCORP") != 0) return docs;
    uint32_t n;
    std::memcpy(&n, c.data() + 8, 4);
    size_t p = 12;
    for (uint32_t i = 0; i < n; ++i) {
        uint8_t kind = uint8_t(c[p]);
        uint32_t len;
        std::memcpy(&len, c.data() + p + 1, 4);
        if (kind == 0) docs.push_back(c.substr(p + 5, len));
        p += 5 + len;
    }
    return docs;
}

}  // namespace

int main(int argc, char **argv) {
    std::string vocab = ds41rt::testing_util::find_vocab();
    int repeat = 5;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = argv[++i];
        else if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: %s [--vocab tokenizer.json] [--repeat N]\n", argv[0]);
            return 2;
        }
    }
    if (vocab.empty()) {
        std::fprintf(stderr, "no tokenizer.json: run scripts/setup.sh or pass --vocab\n");
        return 1;
    }
    std::vector<std::string> docs = load_docs(fs::path(DS41RT_FIXTURES_DIR) / "tokenizer" / "corpus.bin");
    size_t bytes = 0;
    for (const auto &d : docs) bytes += d.size();
    if (docs.empty()) {
        std::fprintf(stderr, "corpus.bin missing\n");
        return 1;
    }

    double t0 = now_s();
    auto r = tokenizer::load(vocab);
    double t_load = now_s() - t0;
    if (!r.is_ok()) {
        std::fprintf(stderr, "%s\n", r.status().to_string().c_str());
        return 1;
    }
    const tokenizer &tok = r.value();
    const double mb = double(bytes) / 1e6;

    std::vector<std::vector<int32_t>> ids(docs.size());
    auto encode_all = [&](size_t first, size_t step) {
        for (size_t i = first; i < docs.size(); i += step) ids[i] = tok.encode(docs[i]);
    };
    t0 = now_s();
    double c0 = thread_cpu_s();
    encode_all(0, 1);
    double t_cold = now_s() - t0, c_cold = thread_cpu_s() - c0;
    size_t n_tokens = 0;
    for (const auto &v : ids) n_tokens += v.size();

    double t_warm = 1e30, c_warm = 1e30;
    for (int k = 0; k < repeat; ++k) {
        t0 = now_s();
        c0 = thread_cpu_s();
        encode_all(0, 1);
        t_warm = std::min(t_warm, now_s() - t0);
        c_warm = std::min(c_warm, thread_cpu_s() - c0);
    }
    double t_two = 1e30;
    for (int k = 0; k < repeat; ++k) {
        t0 = now_s();
        std::thread a(encode_all, 0, 2), b(encode_all, 1, 2);
        a.join();
        b.join();
        t_two = std::min(t_two, now_s() - t0);
    }
    double t_dec = 1e30, c_dec = 1e30;
    size_t out_bytes = 0;
    for (int k = 0; k < repeat; ++k) {
        t0 = now_s();
        c0 = thread_cpu_s();
        out_bytes = 0;
        for (const auto &v : ids) out_bytes += tok.decode(v).size();
        t_dec = std::min(t_dec, now_s() - t0);
        c_dec = std::min(c_dec, thread_cpu_s() - c0);
    }

    std::printf("corpus: %zu documents, %.3f MB, %zu tokens (%.2f bytes/token)\n", docs.size(), mb, n_tokens,
                double(bytes) / double(n_tokens));
    std::printf("load tokenizer.json:          %8.3f s\n", t_load);
    std::printf("                               wall MB/s   thread-CPU MB/s\n");
    std::printf("encode, 1 thread, cold cache: %9.2f %17.2f\n", mb / t_cold, mb / c_cold);
    std::printf("encode, 1 thread, warm cache: %9.2f %17.2f   (best of %d)\n", mb / t_warm, mb / c_warm, repeat);
    std::printf("encode, 2 threads, warm:      %9.2f %17s   (best of %d)\n", mb / t_two, "-", repeat);
    std::printf("decode, 1 thread (text MB/s): %9.2f %17.2f   (best of %d)\n", double(out_bytes) / 1e6 / t_dec,
                double(out_bytes) / 1e6 / c_dec, repeat);
    return 0;
}
