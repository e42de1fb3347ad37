#include "core/crash_report.h"

// glibc's backtrace_symbols: no libdw / libbfd to link, and enough with -rdynamic.
#define BACKWARD_HAS_BACKTRACE_SYMBOL 1
#include <backward.hpp>

namespace ds41rt {

void install_crash_report() {
    // Lives for the process: the handlers it installs refer to it.
    static backward::SignalHandling handling;
}

}  // namespace ds41rt
