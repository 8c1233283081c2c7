#include "kiln/data/import/dicom/internal/isolated.h"

#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace kiln::data::internal {
namespace {

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string LastLine(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

}  // namespace

absl::StatusOr<std::string> RunIsolated(const std::function<absl::StatusOr<std::string>()>& fn) {
  int out[2], err[2];
  if (pipe(out) != 0) return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  if (pipe(err) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  std::cerr.flush();
  fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {  // the child: run fn, send [status byte][message or result], exit
    close(out[0]);
    close(err[0]);
    dup2(err[1], STDERR_FILENO);
    absl::StatusOr<std::string> r = fn();
    const char ok = r.ok() ? 1 : 0;
    const std::string body = r.ok() ? *r : std::string(r.status().message());
    fflush(stderr);
    const bool sent = WriteAll(out[1], &ok, 1) && WriteAll(out[1], body.data(), body.size());
    _exit(sent ? 0 : 1);
  }
  close(out[1]);
  close(err[1]);
  std::string result, stderr_text;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int k = 0; k < 2; ++k) {
      if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(fds[k].fd, buf, sizeof(buf));
      if (n > 0) {
        (k == 0 ? result : stderr_text).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[k].fd);
        fds[k].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return absl::InvalidArgumentError(
        absl::StrCat("GDCM aborted decoding it (signal ", sig, ", ", strsignal(sig), ")",
                     stderr_text.empty() ? "" : ": " + LastLine(stderr_text)));
  }
  if (!stderr_text.empty()) std::cerr << stderr_text << std::flush;  // GDCM's / libjpeg's warnings
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || result.empty()) {
    return absl::InternalError("the decoding child process failed to report a result");
  }
  if (result[0] != 1) return absl::InvalidArgumentError(result.substr(1));
  return result.substr(1);
}

}  // namespace kiln::data::internal
