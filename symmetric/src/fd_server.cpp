// FdServer: a Unix socket in the abstract namespace that hands this
// process's segment descriptors to peers that send the secret and whose
// process is allowed, one request per connection, never blocking for long.

#include "fd_channel_wire.hpp"

namespace symmpool {

using namespace fd_wire;

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

}  // namespace symmpool
