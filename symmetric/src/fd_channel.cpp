#include <symmpool/detail/deadline.hpp>
#include <symmpool/error.hpp>
#include <symmpool/fd_channel.hpp>
#include <symmpool/random_token.hpp>
#include <symmpool/store.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

namespace symmpool {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kMagic[8] = {'S', 'Y', 'M', 'M', 'P', 'F', 'D', 1};  // last byte: version
constexpr std::size_t kRequestBytes = sizeof kMagic + FdServer::kSecretHexChars + 8;
enum Status : char { kOk = 0, kRefused = 1, kNoSuchId = 2 };

constexpr milliseconds kMinTimeout{1};       // 0 must not mean "wait forever"
constexpr milliseconds kAcceptBackoff{10};   // after EMFILE: let descriptors free up
constexpr milliseconds kMaxPoll{100};        // the serve loop rechecks stopping_ this often
constexpr std::size_t kMaxConnections = 64;  // being read at once; the rest wait in the backlog
constexpr int kBacklog = 64;

milliseconds at_least_min(milliseconds t) { return std::max(t, kMinTimeout); }

// Abstract namespace: no file to clean up, gone with the process.
sockaddr_un address_of(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  SYMMPOOL_EXPECTS(!name.empty() && name.size() + 1 < sizeof(addr.sun_path),
                   "bad descriptor socket name '" + name + "'");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// Closes on scope exit.
struct UniqueFd {
  int fd = -1;
  explicit UniqueFd(int f = -1) : fd(f) {}
  ~UniqueFd() {
    if (fd >= 0) ::close(fd);
  }
  UniqueFd(UniqueFd&& other) noexcept : fd(other.release()) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  int release() { return std::exchange(fd, -1); }
};

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, kMaxPoll.count() * 10));
}

// Waits until `fd` reports `events` (or an error/hang-up); false at the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, millis_until(deadline));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
    if (Clock::now() >= deadline) return false;
  }
}

// Sends a status byte, and the descriptor alongside it when fd >= 0. Never
// blocks: the socket is non-blocking and a one-byte reply fits its buffer.
void send_reply(int conn, Status status, int fd) {
  char byte = status;
  iovec iov{&byte, 1};
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
  (void)::sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

// No early exit, so the time taken does not tell how much of a guess matched.
bool equal_constant_time(const char* a, const char* b, std::size_t n) {
  unsigned char diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string encode_request(const std::string& secret, std::uint64_t id) {
  std::string req(kMagic, sizeof kMagic);
  req += secret;
  for (int i = 0; i < 8; ++i) req += static_cast<char>((id >> (8 * i)) & 0xff);
  return req;
}

std::uint64_t decode_id(const char* bytes) {
  std::uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return id;
}

}  // namespace

// A client whose request is still being read.
struct FdServer::Connection {
  int fd;
  Clock::time_point deadline;
  std::string request;
};

FdServer::FdServer(std::function<int(std::uint64_t)> export_fd, FdServerOptions options)
    : secret_(random_token(kSecretBytes)),
      export_fd_(std::move(export_fd)),
      io_timeout_(at_least_min(options.io_timeout)),
      uid_(::geteuid()),
      owner_pid_(::getpid()) {
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  SYMMPOOL_EXPECTS(listen_fd_ >= 0, errno_text("socket"));
  // A random name cannot be guessed or collide (across PID namespaces
  // either); retry the vanishingly rare EADDRINUSE with a fresh one.
  int bound = -1;
  for (int attempt = 0; attempt < 8 && bound != 0; ++attempt) {
    name_ = "symmpool-" + random_token(16);
    socklen_t len = 0;
    sockaddr_un addr = address_of(name_, &len);
    bound = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len);
    if (bound != 0 && errno != EADDRINUSE) break;
  }
  if (bound != 0 || ::listen(listen_fd_, kBacklog) != 0 || ::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::string err = errno_text("cannot serve descriptors on @" + name_);
    ::close(listen_fd_);
    SYMMPOOL_FAIL(err);
  }
  thread_ = std::thread([this] { serve(); });
}

FdServer::~FdServer() {
  if (::getpid() == owner_pid_) {
    // The flag alone would do (the loop never sleeps longer than kMaxPoll);
    // the pipe makes it immediate.
    stopping_ = true;
    char byte = 1;
    (void)::write(wake_pipe_[1], &byte, 1);
    thread_.join();
  } else {
    // A fork()ed child's copy: the thread runs in the owner only (joining
    // it here is undefined, and may hang) and the pipe is the owner's too.
    thread_.detach();
  }
  ::close(listen_fd_);
  ::close(wake_pipe_[0]);
  ::close(wake_pipe_[1]);
}

void FdServer::allow_pids(std::vector<pid_t> pids) {
  std::sort(pids.begin(), pids.end());
  std::lock_guard<std::mutex> lock(allowed_mutex_);
  allowed_pids_ = std::move(pids);
}

bool FdServer::peer_allowed(int conn) const {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) return false;
  if (cred.uid != uid_) return false;
  std::lock_guard<std::mutex> lock(allowed_mutex_);
  return std::binary_search(allowed_pids_.begin(), allowed_pids_.end(), cred.pid);
}

void FdServer::serve() {
  std::vector<Connection> connections;
  std::vector<pollfd> fds;
  while (!stopping_) {
    // Silent clients past their deadline: refused and dropped.
    const auto now = Clock::now();
    auto deadline = now + kMaxPoll;
    for (auto it = connections.begin(); it != connections.end();) {
      if (now < it->deadline) {
        deadline = std::min(deadline, it->deadline);
        ++it;
        continue;
      }
      send_reply(it->fd, kRefused, -1);
      ::close(it->fd);
      it = connections.erase(it);
    }
    const bool accepting = connections.size() < kMaxConnections && now >= accept_after_;
    if (!accepting && connections.size() < kMaxConnections) deadline = std::min(deadline, accept_after_);

    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});  // fd -1: ignored by poll
    for (const Connection& c : connections) fds.push_back({c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), millis_until(deadline)) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(kAcceptBackoff);  // ENOMEM: no busy loop
      continue;
    }
    if (fds[0].revents) {
      // A wake-up, not an order: a fork()ed copy of the owner may write too.
      char buf[64];
      while (::read(wake_pipe_[0], buf, sizeof buf) > 0) {
      }
      if (stopping_) break;
    }

    // Clients with data (or hung up): read; answer once the request is whole.
    std::size_t kept = 0;
    for (std::size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      if (fds[i + 2].revents && read_request(c)) {
        answer(c);
        ::close(c.fd);
      } else {
        connections[kept++] = std::move(c);
      }
    }
    connections.resize(kept);
    if (fds[1].revents) accept_clients(connections);
  }
  for (const Connection& c : connections) ::close(c.fd);
}

// Accepts what the backlog holds, up to kMaxConnections. Peers of another
// uid or outside the allowed pids are refused at once, before reading.
void FdServer::accept_clients(std::vector<Connection>& connections) {
  while (connections.size() < kMaxConnections) {
    const int conn = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      // Out of descriptors: the pending connection stays in the backlog and
      // poll would report it again at once, so pause accepting instead.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_after_ = Clock::now() + kAcceptBackoff;
      return;  // EAGAIN (backlog empty), ECONNABORTED, EINTR: poll again
    }
    if (!peer_allowed(conn)) {
      send_reply(conn, kRefused, -1);
      ::close(conn);
      continue;
    }
    connections.push_back({conn, detail::deadline_after<Clock>(io_timeout_), {}});
  }
}

// Reads what the client sent; true when the request is whole or can never
// be (the client hung up or the socket failed): time to answer.
bool FdServer::read_request(Connection& c) {
  char buf[kRequestBytes];
  const std::size_t want = kRequestBytes - c.request.size();
  const ssize_t r = ::recv(c.fd, buf, want, MSG_DONTWAIT);
  if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  if (r == 0) return true;
  c.request.append(buf, static_cast<std::size_t>(r));
  return c.request.size() == kRequestBytes;
}

void FdServer::answer(const Connection& c) {
  const std::string& req = c.request;
  if (req.size() != kRequestBytes || std::memcmp(req.data(), kMagic, sizeof kMagic) != 0 ||
      !equal_constant_time(req.data() + sizeof kMagic, secret_.data(), kSecretHexChars))
    return send_reply(c.fd, kRefused, -1);
  const std::uint64_t id = decode_id(req.data() + sizeof kMagic + kSecretHexChars);
  int fd = -1;
  try {
    fd = export_fd_(id);
  } catch (...) {
    fd = -1;
  }
  send_reply(c.fd, fd >= 0 ? kOk : kNoSuchId, fd);
  if (fd >= 0) ::close(fd);
}

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
