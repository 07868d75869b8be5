// A fork server for built-in rank processes (NOTE [zygote] in zygote.cpp): gradcert forks it
// before anything else runs, and the local launcher forks ranks from it instead of exec'ing
// gradcert again, so a rank starts without loading LibTorch.
#pragma once
#include <sys/types.h>

namespace gradcert {

/// What a rank forked from the zygote runs: gradcert's own dispatch on the rank's argv
/// ({exe, "worker", ...}); its return value is the rank's exit code.
using ZygoteEntry = int (*)(int argc, char** argv);

/// Forks the zygote. Call it first in main, while this process has one thread; returns false
/// (and starts nothing) when it has more, when GRADCERT_NO_ZYGOTE is set, or when fork fails.
bool start_zygote(ZygoteEntry entry);

/// The zygote's pid (-1 when none runs): never one of a launch's leftovers (NOTE [orphans]).
pid_t zygote_pid();

/// Starts argv as a child of this process through the zygote, in process group `pgid` (0: a
/// new group led by the child), with stdin on /dev/null and stdout and stderr on `log_fd`, as
/// the launcher's fork/exec would. Only a command line of this executable's `worker` verb
/// qualifies. Returns the pid, or -1 when the zygote cannot (none runs, it died, another
/// command, this process is not a child subreaper): the caller then forks and execs.
pid_t zygote_spawn(char* const* argv, char* const* envp, int log_fd, pid_t pgid);

/// Flushes stdio and the C++ streams and ends the process with `code`, without static
/// destructors (LibTorch's take 0.1-0.25 s, and nothing of gradcert's needs them).
[[noreturn]] void exit_now(int code);

}  // namespace gradcert
