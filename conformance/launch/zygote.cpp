#include "conformance/launch/zygote.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

extern char** environ;

namespace gradcert {

// NOTE [zygote] A built-in rank is `gradcert worker`, and a fresh gradcert process spends
// 0.2-0.4 s loading LibTorch and running its static initialisers before main, and 0.1-0.25 s in
// its static destructors after: more than the default spec's whole training. So `run`, `certify`
// and `audit` fork a zygote as the first thing main does, while the process still has one thread
// (fork is only safe then, and LibTorch is loaded but has started nothing). The local launcher
// asks it for each rank over a socket, passing the rank's argv, environment, process group and
// log pipe (SCM_RIGHTS); the zygote forks an intermediate that forks the rank and exits at once,
// so the rank is orphaned to the nearest child subreaper, gradcert itself (launch() makes it
// one, NOTE [orphans]), and is gradcert's child from then on: waitpid, stop signals, blame, log
// caps and timeouts are the launcher's as for a fork/exec'd rank. The rank waits until it is,
// then sets its parent-death signal, resets signals, takes its stdio, replaces the environment
// and runs gradcert's dispatch on its argv, as the exec'd program would from main. What differs
// from an exec: libraries that read the environment while loading read gradcert's (the rank's
// differs only by GRADCERT_* variables), and /proc/<pid>/cmdline shows gradcert's command line
// (the process name is "gradcert-rank"). Anything else (mpirun, a stack's command, the Python
// tools, GRADCERT_NO_ZYGOTE=1, a zygote that died) is forked and exec'd as before.

namespace {

pid_t g_zygote = -1;
int g_socket = -1;  // gradcert's end of the socket to the zygote
ZygoteEntry g_entry = nullptr;
dev_t g_exe_dev = 0;
ino_t g_exe_ino = 0;

constexpr uint32_t kMagic = 0x67637a31;  // "gcz1"

struct Header {
  uint32_t magic = kMagic;
  uint32_t argc = 0;
  uint32_t payload = 0;  // bytes of NUL-terminated strings that follow: argv, then the environment
  int32_t pgid = 0;
};

int threads_of_this_process() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// All n bytes through read(2) or write(2), retrying EINTR; false at an error or end of file.
template <typename Byte, typename Io>
bool all_bytes(Io io, int fd, Byte* c, size_t n) {
  while (n > 0) {
    const ssize_t k = io(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool read_exact(int fd, void* p, size_t n) { return all_bytes(::read, fd, static_cast<char*>(p), n); }
bool write_exact(int fd, const void* p, size_t n) { return all_bytes(::write, fd, static_cast<const char*>(p), n); }

// A request's header as one message, with room for the log fd, which rides on its bytes.
struct HeaderMessage {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov;
  msghdr msg{};
  explicit HeaderMessage(Header& h) : iov{&h, sizeof h} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  HeaderMessage(const HeaderMessage&) = delete;  // msg points into this object
  HeaderMessage& operator=(const HeaderMessage&) = delete;
};

// The header and the log fd of one request.
bool receive_header(int sock, Header& h, int& fd) {
  fd = -1;
  HeaderMessage m(h);
  msghdr& msg = m.msg;
  ssize_t r;
  do {
    r = ::recvmsg(sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r != static_cast<ssize_t>(sizeof h)) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return h.magic == kMagic && fd >= 0;
}

// The rank, in the zygote's grandchild: becomes gradcert's child, then runs as `gradcert worker`.
[[noreturn]] void become_rank(pid_t harness, const Header& h, int log_fd, std::vector<char*>& argv,
                              std::vector<char*>& env) {
  ::setpgid(0, h.pgid);
  // The intermediate exits right after the fork: then the kernel hands this process to gradcert.
  for (int i = 0; ::getppid() != harness; ++i) {
    if (i > 100000) ::_exit(127);
    ::usleep(20);
  }
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != harness) ::_exit(127);
  ::prctl(PR_SET_NAME, "gradcert-rank");
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD}) ::signal(sig, SIG_DFL);
  const int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    if (devnull != 0) ::close(devnull);
  }
  ::dup2(log_fd, 1);
  ::dup2(log_fd, 2);
  if (log_fd > 2) ::close(log_fd);
  environ = env.data();
  static const char kSaid[] = "gradcert: this rank was forked from the zygote (NOTE [zygote])\n";
  write_exact(2, kSaid, sizeof kSaid - 1);
  exit_now(g_entry(static_cast<int>(h.argc), argv.data()));
}

// The zygote: one request at a time, until gradcert closes the socket or dies.
[[noreturn]] void serve(int sock, pid_t harness) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != harness) ::_exit(0);
  ::prctl(PR_SET_NAME, "gradcert-zygote");
  // Ctrl-C reaches the whole foreground group: gradcert stops its ranks and writes the report;
  // the zygote ends with gradcert (its parent-death signal).
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGCHLD, SIG_DFL);
  for (;;) {
    Header h;
    int log_fd = -1;
    if (!receive_header(sock, h, log_fd)) ::_exit(0);
    std::vector<char> payload(h.payload);
    if (h.payload > (64u << 20) || !read_exact(sock, payload.data(), payload.size())) ::_exit(0);
    std::vector<char*> argv, env;
    for (size_t at = 0; at < payload.size();) {
      char* s = payload.data() + at;
      const size_t len = ::strnlen(s, payload.size() - at);
      if (at + len >= payload.size()) ::_exit(0);  // not NUL-terminated: not gradcert's
      (argv.size() < h.argc ? argv : env).push_back(s);
      at += len + 1;
    }
    if (argv.size() != h.argc || h.argc == 0) ::_exit(0);
    argv.push_back(nullptr);
    env.push_back(nullptr);
    int32_t reply = -EAGAIN;
    int pid_pipe[2];
    if (::pipe2(pid_pipe, O_CLOEXEC) == 0) {
      const pid_t mid = ::fork();
      if (mid == 0) {
        ::close(pid_pipe[0]);
        const pid_t rank = ::fork();
        if (rank == 0) {
          ::close(pid_pipe[1]);
          ::close(sock);
          become_rank(harness, h, log_fd, argv, env);
        }
        const int32_t sent = rank > 0 ? rank : -errno;
        write_exact(pid_pipe[1], &sent, sizeof sent);
        ::_exit(0);
      }
      ::close(pid_pipe[1]);
      if (mid > 0) {
        int32_t got = 0;
        reply = read_exact(pid_pipe[0], &got, sizeof got) ? got : -EPIPE;
        int status = 0;
        while (::waitpid(mid, &status, 0) < 0 && errno == EINTR) {}
      } else {
        reply = -errno;
      }
      ::close(pid_pipe[0]);
    } else {
      reply = -errno;
    }
    ::close(log_fd);
    if (!write_exact(sock, &reply, sizeof reply)) ::_exit(0);
  }
}

void stop_using_zygote() {
  if (g_socket >= 0) ::close(g_socket);
  g_socket = -1;
  g_zygote = -1;
}

}  // namespace

bool start_zygote(ZygoteEntry entry) {
  if (g_zygote > 0 || !entry) return g_zygote > 0;
  if (const char* off = std::getenv("GRADCERT_NO_ZYGOTE"); off && *off && std::string(off) != "0") return false;
  if (threads_of_this_process() != 1) return false;
  struct stat exe{};
  if (::stat("/proc/self/exe", &exe) != 0) return false;
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  const pid_t harness = ::getpid();
  g_entry = entry;
  const pid_t z = ::fork();
  if (z < 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return false;
  }
  if (z == 0) {
    ::close(sv[0]);
    serve(sv[1], harness);
  }
  ::close(sv[1]);
  g_socket = sv[0];
  g_zygote = z;
  g_exe_dev = exe.st_dev;
  g_exe_ino = exe.st_ino;
  return true;
}

pid_t zygote_pid() { return g_zygote; }

pid_t zygote_spawn(char* const* argv, char* const* envp, int log_fd, pid_t pgid) {
  if (g_socket < 0 || !argv[0] || !argv[1] || std::strcmp(argv[1], "worker") != 0) return -1;
  struct stat exe{};
  if (::stat(argv[0], &exe) != 0 || exe.st_dev != g_exe_dev || exe.st_ino != g_exe_ino) return -1;
  int subreaper = 0;
  if (::prctl(PR_GET_CHILD_SUBREAPER, &subreaper) != 0 || !subreaper) return -1;
  Header h;
  h.pgid = pgid;
  std::string payload;
  for (char* const* a = argv; *a; ++a, ++h.argc) payload.append(*a).push_back('\0');
  for (char* const* e = envp; e && *e; ++e) payload.append(*e).push_back('\0');
  h.payload = static_cast<uint32_t>(payload.size());

  HeaderMessage m(h);
  msghdr& msg = m.msg;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &log_fd, sizeof log_fd);
  ssize_t sent;
  do {
    sent = ::sendmsg(g_socket, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(sizeof h) || !write_exact(g_socket, payload.data(), payload.size())) {
    stop_using_zygote();  // it died (a kill of the whole group, say): fork/exec from now on
    return -1;
  }
  // A healthy zygote answers within milliseconds; one that does not is given up.
  pollfd p{g_socket, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, 10000);
  } while (ready < 0 && errno == EINTR);
  int32_t reply = 0;
  if (ready != 1 || !read_exact(g_socket, &reply, sizeof reply)) {
    stop_using_zygote();
    return -1;
  }
  if (reply <= 0) return -1;
  return static_cast<pid_t>(reply);
}

void exit_now(int code) {
  if (g_zygote > 0) {  // reaped here: whatever process adopts it may never reap
    ::kill(g_zygote, SIGKILL);
    while (::waitpid(g_zygote, nullptr, 0) < 0 && errno == EINTR) {}
  }
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace gradcert
