// A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT...) in any ds41rt process prints a
// stack trace to stderr before the process dies of it, so a worker that crashes leaves in its
// log where (backward-cpp's signal handling; symbols from the binary's dynamic table, addresses
// for addr2line otherwise). The process still ends by that signal: supervisors and tests see the
// same exit status.
//
// Threads: call once, early in main, before other threads start.
#pragma once

namespace ds41rt {

void install_crash_report();

}  // namespace ds41rt
