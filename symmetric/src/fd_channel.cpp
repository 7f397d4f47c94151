// fetch_fd: a client of a peer's FdServer, with a deadline on every step,
// checking that the server is the process it expects.

#include "fd_channel_wire.hpp"

namespace symmpool {

using namespace fd_wire;

namespace {

std::string describe(const std::string& name, std::uint64_t id) {
  return "descriptor server @" + name + " (id " + std::to_string(id) + ")";
}

[[noreturn]] void no_answer(const std::string& name, std::uint64_t id, milliseconds timeout,
                            const std::string& what) {
  throw timeout_error("symmpool: " + describe(name, id) + " " + what + " within " +
                      std::to_string(timeout.count()) + " ms (peer gone or stuck?)");
}

// Connects without blocking, retrying while the backlog is full, or nobody
// listens yet (kRetry), until `deadline`.
UniqueFd connect_until(const std::string& name, std::uint64_t id, Clock::time_point deadline,
                       milliseconds timeout, IfNobodyListens if_nobody_listens) {
  socklen_t len = 0;
  const sockaddr_un addr = address_of(name, &len);
  for (;;) {
    UniqueFd conn(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    SYMMPOOL_EXPECTS(conn.fd >= 0, errno_text("socket"));
    int err = ::connect(conn.fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      err = ETIMEDOUT;
      socklen_t n = sizeof err;
      if (wait_for(conn.fd, POLLOUT, deadline)) ::getsockopt(conn.fd, SOL_SOCKET, SO_ERROR, &err, &n);
    }
    if (err == 0) return conn;
    if ((err == ECONNREFUSED || err == ENOENT) && if_nobody_listens == IfNobodyListens::kPeerGone)
      throw std::runtime_error("symmpool: nobody listens on " + describe(name, id) + " any more (" +
                               std::strerror(err) + "): the process that served it is gone");
    if (err != ECONNREFUSED && err != ENOENT && err != EAGAIN && err != EINTR && err != ETIMEDOUT)
      SYMMPOOL_FAIL("cannot connect to " + describe(name, id) + ": " + std::strerror(err));
    if (Clock::now() >= deadline) no_answer(name, id, timeout, "accepted no connection");
    std::this_thread::sleep_for(std::min<Clock::duration>(milliseconds(2), deadline - Clock::now()));
  }
}

// Anyone can bind an abstract name that is free (its server gone), so the
// secret goes only to the expected process, and only its descriptors are
// taken. For a client, SO_PEERCRED names whoever called listen().
void check_server(int conn, const std::string& name, std::uint64_t id, pid_t server_pid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  const bool known = ::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred;
  if (known && cred.uid == ::geteuid() && cred.pid == server_pid) return;
  const std::string owner = known ? "uid " + std::to_string(cred.uid) + " pid " + std::to_string(cred.pid)
                                  : "unknown (SO_PEERCRED failed)";
  SYMMPOOL_FAIL(describe(name, id) + " is not the expected process: the socket belongs to " + owner +
                ", expected uid " + std::to_string(::geteuid()) + " pid " + std::to_string(server_pid) +
                "; nothing was sent (the peer gone and its name taken by another process? a different PID "
                "namespace?)");
}

// Sends the whole request by `deadline`. A send error is left to the reply:
// a server that refused us at once may have closed already, its answer queued.
void send_until(int conn, const std::string& request, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < request.size() && wait_for(conn, POLLOUT, deadline)) {
    const ssize_t r = ::send(conn, request.data() + sent, request.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r < 0) return;
    sent += static_cast<std::size_t>(r);
  }
}

struct Reply {
  bool answered = false;
  char status = kRefused;
  int fd = -1;  // the first descriptor received; any others are closed
};

Reply receive_until(int conn, Clock::time_point deadline) {
  Reply reply;
  while (wait_for(conn, POLLIN, deadline)) {
    iovec iov{&reply.status, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t r = ::recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) return reply;  // closed without a word
    reply.answered = true;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (reply.fd < 0)
          reply.fd = fd;
        else
          ::close(fd);
      }
    }
    return reply;
  }
  return reply;
}

}  // namespace

int fetch_fd(const std::string& name, pid_t server_pid, const std::string& secret, std::uint64_t id,
             milliseconds timeout, IfNobodyListens if_nobody_listens) {
  SYMMPOOL_EXPECTS(secret.size() == FdServer::kSecretHexChars,
                   "the secret for " + describe(name, id) + " has " + std::to_string(secret.size()) +
                       " characters, not " + std::to_string(FdServer::kSecretHexChars));
  timeout = at_least_min(timeout);
  const auto deadline = detail::deadline_after<Clock>(timeout);
  UniqueFd conn = connect_until(name, id, deadline, timeout, if_nobody_listens);
  check_server(conn.fd, name, id, server_pid);
  send_until(conn.fd, encode_request(secret, id), deadline);
  Reply reply = receive_until(conn.fd, deadline);
  UniqueFd fd(reply.fd);
  if (!reply.answered) no_answer(name, id, timeout, "did not answer");
  if (reply.status == kOk && fd.fd >= 0) return fd.release();
  if (reply.status == kNoSuchId) SYMMPOOL_FAIL(describe(name, id) + " has no such descriptor");
  if (reply.status == kRefused)
    SYMMPOOL_FAIL(describe(name, id) + " refused this process (pid " + std::to_string(::getpid()) +
                  "): wrong secret, another uid, or a pid outside its group (a different PID "
                  "namespace counts)");
  SYMMPOOL_FAIL(describe(name, id) + " sent a malformed reply (status " + std::to_string(int(reply.status)) +
                (fd.fd >= 0 ? ")" : ", no descriptor)"));
}

}  // namespace symmpool
