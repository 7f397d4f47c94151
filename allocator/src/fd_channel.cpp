#include <symmpool/error.hpp>
#include <symmpool/fd_channel.hpp>
#include <symmpool/store.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <thread>

namespace symmpool {

namespace {

// Abstract namespace: no file to clean up, gone with the process.
sockaddr_un address_of(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  SYMMPOOL_EXPECTS(name.size() + 1 < sizeof(addr.sun_path), "socket name too long: " + name);
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

bool read_all(int fd, void* buf, std::size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

// Sends a status byte, and the descriptor alongside it when fd >= 0.
void send_reply(int conn, int fd) {
  char status = fd >= 0 ? 0 : 1;
  iovec iov{&status, 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  (void)::sendmsg(conn, &msg, MSG_NOSIGNAL);
}

}  // namespace

FdServer::FdServer(std::string name, std::function<int(std::uint64_t)> export_fd)
    : name_(std::move(name)), export_fd_(std::move(export_fd)) {
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SYMMPOOL_EXPECTS(listen_fd_ >= 0, errno_text("socket"));
  socklen_t len = 0;
  sockaddr_un addr = address_of(name_, &len);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, 64) != 0 || ::pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    std::string err = errno_text(("cannot serve descriptors on @" + name_).c_str());
    ::close(listen_fd_);
    SYMMPOOL_FAIL(err);
  }
  thread_ = std::thread([this] { serve(); });
}

FdServer::~FdServer() {
  char byte = 1;
  (void)::write(wake_pipe_[1], &byte, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_pipe_[0]);
  ::close(wake_pipe_[1]);
}

void FdServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    std::uint64_t id = 0;
    if (read_all(conn, &id, sizeof id)) {
      int fd = -1;
      try {
        fd = export_fd_(id);
      } catch (...) {
        fd = -1;
      }
      send_reply(conn, fd);
      if (fd >= 0) ::close(fd);
    }
    ::close(conn);
  }
}

int fetch_fd(const std::string& name, std::uint64_t id, std::chrono::milliseconds timeout) {
  socklen_t len = 0;
  sockaddr_un addr = address_of(name, &len);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int conn = -1;
  for (;;) {
    conn = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SYMMPOOL_EXPECTS(conn >= 0, errno_text("socket"));
    if (::connect(conn, reinterpret_cast<sockaddr*>(&addr), len) == 0) break;
    ::close(conn);
    if (std::chrono::steady_clock::now() >= deadline)
      throw timeout_error("symmpool: no descriptor server @" + name + " answered within " +
                          std::to_string(timeout.count()) + " ms (peer gone?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::write(conn, &id, sizeof id) != static_cast<ssize_t>(sizeof id)) {
    ::close(conn);
    SYMMPOOL_FAIL(errno_text(("request to @" + name).c_str()));
  }
  char status = 1;
  iovec iov{&status, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t r = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
  ::close(conn);
  if (r != 1) throw timeout_error("symmpool: descriptor server @" + name + " did not reply for id " + std::to_string(id));
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (status != 0 || c == nullptr || c->cmsg_type != SCM_RIGHTS)
    SYMMPOOL_FAIL("descriptor server @" + name + " has no descriptor " + std::to_string(id));
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

}  // namespace symmpool
