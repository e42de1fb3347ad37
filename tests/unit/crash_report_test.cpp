// install_crash_report: a child process that crashes prints a stack trace to stderr and still
// dies of the signal (the exit status supervisors and the NCCL fault test read).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "core/crash_report.h"

namespace ds41rt {
namespace {

TEST(CrashReport, AFatalSignalPrintsAStackTraceAndStillKills) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        install_crash_report();
        std::raise(SIGSEGV);
        _exit(0);  // not reached
    }
    close(fds[1]);
    std::string err;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) err.append(buf, size_t(n));
    close(fds[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
    if (WIFSIGNALED(status)) EXPECT_EQ(WTERMSIG(status), SIGSEGV);
    EXPECT_NE(err.find("Stack trace"), std::string::npos) << err;
    EXPECT_NE(err.find("#0"), std::string::npos) << err;
}

}  // namespace
}  // namespace ds41rt
