// The process supervisor of `ds41rt launch` (launcher.h): POSIX fork/exec, a synchronous signal
// loop (sigtimedwait), readiness probes (the worker handshake, the coordinator's /health).
#include "app/launcher.h"

#include <httplib.h>
#include <fmt/format.h>

#include <fcntl.h>
#include <netdb.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>

#include "dist/hello.h"
#include "dist/tcp_transport.h"

extern char **environ;

namespace ds41rt::app {

namespace {

using steady = std::chrono::steady_clock;

template <typename... Args>
void say(fmt::format_string<Args...> f, Args &&...args) {
    fmt::print(stderr, "ds41rt launch: {}\n", fmt::format(f, std::forward<Args>(args)...));
    std::fflush(stderr);
}

struct child {
    const dist::launch_command *cmd = nullptr;
    int worker = -1;  // index in the plan's workers; -1 for the coordinator
    pid_t pid = -1;
    bool running = false;
    int wait_status = 0;
    steady::time_point started;
    steady::time_point restart_at;  // a worker that died, to be started again then
    bool restart_pending = false;
};

std::string describe_exit(int st) {
    if (WIFEXITED(st)) return fmt::format("exited with status {}", WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return fmt::format("was killed by signal {} ({})", WTERMSIG(st), strsignal(WTERMSIG(st)));
    return "stopped";
}

// An exit we asked for: status 0, or the SIGTERM / SIGINT we sent before the child installed its handler.
bool clean_exit(int st) {
    return (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
           (WIFSIGNALED(st) && (WTERMSIG(st) == SIGTERM || WTERMSIG(st) == SIGINT));
}

class supervisor {
public:
    supervisor(const dist::deployment &d, const dist::Plan &plan, const std::vector<dist::launch_command> &cmds,
               const launch_options &o)
        : d_(d), plan_(plan), o_(o) {
        for (const auto &c : cmds) {
            if (!c.local) continue;
            child ch;
            ch.cmd = &c;
            ch.worker = c.worker;
            children_.push_back(ch);
        }
        for (const auto &c : cmds)
            if (!c.local) remote_.push_back(&c);
        sigemptyset(&signals_);
        sigaddset(&signals_, SIGINT);
        sigaddset(&signals_, SIGTERM);
        sigaddset(&signals_, SIGHUP);  // the terminal went away: stop in order, as for SIGTERM
        sigaddset(&signals_, SIGCHLD);
        // Not restored on return: a stop signal still pending would then end the launcher with
        // its default action instead of the exit status run() chose.
        sigprocmask(SIG_BLOCK, &signals_, nullptr);
    }

    int run();

private:
    bool probe_remote_workers();
    bool check_ports();
    bool spawn(child &c);
    void reap();
    int wait_signal(int ms);
    bool wait_worker_ready(child &c);
    bool wait_coordinator_healthy(child &c);
    bool stop_all();
    void stop_one_group(std::vector<child *> group);
    child &coordinator() { return children_.back(); }
    std::string name(const child &c) const { return c.cmd->role + " (" + c.cmd->endpoint + ")"; }

    const dist::deployment &d_;
    const dist::Plan &plan_;
    const launch_options &o_;
    std::vector<child> children_;  // local workers in rank order, then the coordinator
    std::vector<const dist::launch_command *> remote_;
    sigset_t signals_;
    int stop_signals_ = 0;  // SIGINT / SIGTERM / SIGHUP received
};

int supervisor::wait_signal(int ms) {
    timespec ts{ms / 1000, long(ms % 1000) * 1000000L};
    const int sig = sigtimedwait(&signals_, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
        stop_signals_++;
        say("{} received; stopping the deployment{}", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP", stop_signals_ > 1 ? " now (SIGKILL)" : "");
    }
    return sig > 0 ? sig : 0;
}

void supervisor::reap() {
    for (;;) {
        int st = 0;
        const pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0) return;
        for (child &c : children_)
            if (c.running && c.pid == pid) {
                c.running = false;
                c.wait_status = st;
            }
    }
}

bool supervisor::spawn(child &c) {
    const dist::launch_command &cmd = *c.cmd;
    // Everything the child needs is built before fork: after it only async-signal-safe calls.
    std::vector<std::string> args = cmd.argv;
    if (args[0] == "ds41rt" && !o_.self_binary.empty()) args[0] = o_.self_binary;
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char **e = environ; *e; e++) {
        bool overridden = false;
        for (const auto &[k, v] : cmd.env) overridden = overridden || std::strncmp(*e, (k + "=").c_str(), k.size() + 1) == 0;
        if (!overridden) env_strings.emplace_back(*e);
    }
    for (const auto &[k, v] : cmd.env) env_strings.push_back(k + "=" + v);
    std::vector<char *> envp;
    for (auto &e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
        say("{}: fork failed: {}", name(c), std::strerror(errno));
        return false;
    }
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        std::signal(SIGPIPE, SIG_DFL);
        setpgid(0, 0);                     // the terminal's Ctrl-C is the launcher's to forward, in order
        prctl(PR_SET_PDEATHSIG, SIGTERM);  // ... and a launcher that dies takes its children with it
        if (getppid() != parent) _exit(127);
        execvpe(argv[0], argv.data(), envp.data());
        const char *msg = "ds41rt launch: exec failed: ";
        (void)!write(2, msg, std::strlen(msg));
        (void)!write(2, argv[0], std::strlen(argv[0]));
        (void)!write(2, "\n", 1);
        _exit(127);
    }
    setpgid(pid, pid);
    c.pid = pid;
    c.running = true;
    c.restart_pending = false;
    c.started = steady::now();
    say("started {} as pid {}: {}", c.cmd->role, pid, cmd.line);
    return true;
}

// Remote workers cannot be started from here: each must already listen and run this plan.
bool supervisor::probe_remote_workers() {
    bool ok = true;
    for (const dist::launch_command *r : remote_) {
        const int w = r->worker;
        Status st;
        auto ch = dist::tcp_channel::connect(r->endpoint, dist::after_ms(3000));
        if (!ch) st = ch.status();
        else st = dist::hello(**ch, plan_.version(), uint32_t(w), dist::after_ms(5000));
        if (st.is_ok()) {
            say("{} at {} (on {}) is up and runs this plan", r->role, r->endpoint, r->host);
            continue;
        }
        say("{} at {} is on another host ({}); the launcher cannot start it, so it must already be running with "
            "this plan. Copy {} there and start it with:\n    {}\n  probing it failed: {}",
            r->role, r->endpoint, r->host, d_.plan_path, r->line, st.message());
        ok = false;
    }
    return ok;
}

// Where to reach a listener on host:port from this machine (a wildcard address is not one).
std::string probe_endpoint(const std::string &host, int port) {
    std::string h = host;
    if (h == "0.0.0.0" || h.empty()) h = "127.0.0.1";
    if (h == "::") h = "::1";
    return h + ":" + std::to_string(port);
}

// A port another process holds is named now rather than found in a child's log later. Taken
// means: something accepts connections there (also a listener that shares ports with
// SO_REUSEPORT, as cpp-httplib's do, which a bind alone would not reveal: a stale server would
// silently get half the requests), or a bind as the servers do it fails. Connections in
// TIME_WAIT do not count; the servers bind over them.
bool supervisor::check_ports() {
    bool ok = true;
    for (const child &c : children_) {
        std::string host;
        int port = 0;
        if (!dist::split_endpoint(c.cmd->endpoint, &host, &port).is_ok()) continue;
        if (dist::tcp_channel::connect(probe_endpoint(host, port), dist::after_ms(500))) {
            say("{}: port {} is already in use (another process listens on {})", c.cmd->role, port, c.cmd->endpoint);
            ok = false;
            continue;
        }
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_PASSIVE;
        addrinfo *res = nullptr;
        if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
            say("{}: cannot resolve {}: {}", c.cmd->role, c.cmd->endpoint, gai_strerror(rc));
            ok = false;
            continue;
        }
        const int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
        int one = 1;
        if (fd >= 0) {
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        }
        if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
            const int e = errno;
            if (e == EADDRINUSE)
                say("{}: port {} is already in use ({} is bound by another process)", c.cmd->role, port, c.cmd->endpoint);
            else
                say("{}: cannot listen on {}: {}", c.cmd->role, c.cmd->endpoint, std::strerror(e));
            ok = false;
        }
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
    }
    return ok;
}

bool supervisor::wait_worker_ready(child &c) {
    const auto until = steady::now() + std::chrono::seconds(o_.startup_timeout_s);
    while (steady::now() < until) {
        reap();
        if (!c.running) {
            say("{} {} during startup (its log is above)", name(c), describe_exit(c.wait_status));
            return false;
        }
        if (stop_signals_) return false;
        auto ch = dist::tcp_channel::connect(c.cmd->endpoint, dist::after_ms(500));
        if (ch) {
            Status st = dist::hello(**ch, plan_.version(), uint32_t(c.worker), dist::after_ms(10000));
            if (st.is_ok()) {
                say("{} is up", name(c));
                return true;
            }
            say("{} answered the handshake wrongly: {}", name(c), st.message());
            return false;
        }
        wait_signal(100);
    }
    say("{} did not listen within {} s", name(c), o_.startup_timeout_s);
    return false;
}

bool supervisor::wait_coordinator_healthy(child &c) {
    std::string host;
    int port = 0;
    (void)dist::split_endpoint(c.cmd->endpoint, &host, &port);
    const std::string probe = probe_endpoint(host, port);
    host = probe.substr(0, probe.rfind(':'));
    httplib::Client http(host, port);
    http.set_connection_timeout(0, 500000);
    http.set_read_timeout(10, 0);
    const auto until = steady::now() + std::chrono::seconds(o_.startup_timeout_s);
    while (steady::now() < until) {
        reap();
        for (const child &w : children_)
            if (w.worker >= 0 && !w.running) {
                say("{} {} while the coordinator was starting (its log is above)", name(w), describe_exit(w.wait_status));
                return false;
            }
        if (!c.running) {
            say("{} {} during startup (its log is above)", name(c), describe_exit(c.wait_status));
            return false;
        }
        if (stop_signals_) return false;
        if (auto res = http.Get("/health"); res && res->status == 200) {
            say("coordinator is healthy: http://{}:{}/v1", host, port);
            return true;
        }
        wait_signal(100);
    }
    say("{} was not healthy within {} s", name(c), o_.startup_timeout_s);
    return false;
}

// SIGTERM to every running member of the group, SIGKILL to what outlives stop_timeout_s (or a
// second stop signal), then waits for each.
void supervisor::stop_one_group(std::vector<child *> group) {
    for (child *c : group)
        if (c->running) {
            kill(c->pid, SIGTERM);
            kill(c->pid, SIGCONT);  // a stopped process would not see the SIGTERM
        }
    const auto until = steady::now() + std::chrono::seconds(o_.stop_timeout_s);
    for (;;) {
        reap();
        bool any = false;
        for (child *c : group) any = any || c->running;
        if (!any) return;
        if (stop_signals_ > 1 || steady::now() >= until) break;
        wait_signal(50);
    }
    for (child *c : group)
        if (c->running) {
            say("{} did not stop; SIGKILL", name(*c));
            kill(c->pid, SIGKILL);
            int st = 0;
            if (waitpid(c->pid, &st, 0) == c->pid) {
                c->running = false;
                c->wait_status = st;
            }
        }
}

// Coordinator first (it stops taking requests and drains), then the workers it was using.
// True when every child ended cleanly.
bool supervisor::stop_all() {
    std::vector<child *> coord, workers;
    for (child &c : children_) (c.worker < 0 ? coord : workers).push_back(&c);
    stop_one_group(coord);
    stop_one_group(workers);
    bool clean = true;
    for (const child &c : children_) {
        if (c.pid < 0) continue;
        if (!clean_exit(c.wait_status)) {
            say("{} {}", name(c), describe_exit(c.wait_status));
            clean = false;
        }
    }
    return clean;
}

int supervisor::run() {
    if (!probe_remote_workers() || !check_ports()) return 1;
    for (child &c : children_) {
        if (c.worker < 0) break;
        if (!spawn(c) || !wait_worker_ready(c)) {
            stop_all();
            return 1;
        }
    }
    if (!spawn(coordinator()) || !wait_coordinator_healthy(coordinator())) {
        stop_all();
        return 1;
    }
    say("deployment up: {} local worker(s), {} remote; SIGINT (Ctrl-C) or SIGTERM to the launcher (pid {}) stops it",
        children_.size() - 1, remote_.size(), getpid());
    for (;;) {
        wait_signal(500);
        reap();
        if (stop_signals_) {
            const bool clean = stop_all();
            say("stopped{}", clean ? "" : " (not every process ended cleanly)");
            return clean ? 0 : 1;
        }
        child &coord = coordinator();
        if (!coord.running) {
            say("{} {}; stopping the workers", name(coord), describe_exit(coord.wait_status));
            stop_all();
            return 1;
        }
        for (child &w : children_) {
            if (w.worker < 0 || w.running) continue;
            if (!w.restart_pending) {
                // At most one start per 5 s, so a worker that cannot start does not spin.
                w.restart_pending = true;
                w.restart_at = std::max(steady::now(), w.started + std::chrono::seconds(5));
                say("{} {}; the coordinator answers 503 for its layers until it is back; restarting it", name(w),
                    describe_exit(w.wait_status));
            }
            if (steady::now() >= w.restart_at) spawn(w);
        }
    }
}

}  // namespace

int run_deployment(const dist::deployment &d, const dist::Plan &plan, const std::vector<dist::launch_command> &cmds,
                   const launch_options &o) {
    supervisor s(d, plan, cmds, o);
    return s.run();
}

}  // namespace ds41rt::app
