#pragma once
// File descriptors between processes of one node, over abstract Unix domain
// sockets (SCM_RIGHTS). A server thread answers "send me descriptor <id>"
// with a freshly exported descriptor; peers fetch lazily, when they map.
//
// The descriptors map a job's GPU memory read-write, and any local process
// can connect to an abstract socket, so the server serves only its group:
//  - the peer must run under the server's effective uid and be one of the
//    pids the owner allowed (SO_PEERCRED; nobody before allow_pids());
//  - the request must carry the server's random secret (compared in
//    constant time);
//  - the socket name is random, so it neither collides nor can be guessed.
// Every socket operation has a deadline: a silent or malformed client is
// dropped after io_timeout without delaying the others, and the destructor
// returns promptly whatever the clients do. In a fork()ed child, destroying
// the inherited copy only closes the child's descriptors: the owner's server
// keeps serving.
//
// Wire format (fixed size, anything else is refused):
//   request: 8-byte magic "SYMMPFD" + version byte (1), the secret as
//            kSecretHexChars hex characters, the id as 8 bytes little-endian;
//   reply:   one status byte (0 ok, 1 refused, 2 no such id), with the
//            descriptor attached (SCM_RIGHTS) when ok.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace symmpool {

struct FdServerOptions {
  // How long a client may take to send its request once connected; a
  // silent one is refused and dropped then. Under 1 ms counts as 1 ms.
  std::chrono::milliseconds io_timeout{1000};
};

class FdServer {
 public:
  static constexpr std::size_t kSecretBytes = 32;
  static constexpr std::size_t kSecretHexChars = 2 * kSecretBytes;
  // Longest name() the server makes; a peer's name is checked against it.
  static constexpr std::size_t kMaxNameChars = 64;

  // `export_fd(id)` returns a new descriptor for `id` (closed here once
  // sent), or -1 when there is no such id. Picks a random socket name and a
  // random secret; serves nobody until allow_pids().
  explicit FdServer(std::function<int(std::uint64_t)> export_fd, FdServerOptions options = {});
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  // The abstract socket name (without the leading NUL) and the secret
  // (kSecretHexChars hex characters) that peers pass to fetch_fd.
  const std::string& name() const { return name_; }
  const std::string& secret() const { return secret_; }

  // The processes served from now on (replacing any earlier set); they must
  // also run under this process's effective uid.
  void allow_pids(std::vector<pid_t> pids);

 private:
  struct Connection;
  void serve();
  void accept_clients(std::vector<Connection>& connections);
  bool peer_allowed(int conn) const;
  bool read_request(Connection& c);
  void answer(const Connection& c);

  std::string name_;
  std::string secret_;
  std::function<int(std::uint64_t)> export_fd_;
  std::chrono::milliseconds io_timeout_;
  uid_t uid_;
  pid_t owner_pid_;  // a fork()ed child's copy neither stops nor joins the server
  mutable std::mutex allowed_mutex_;
  std::vector<pid_t> allowed_pids_;                       // sorted
  std::chrono::steady_clock::time_point accept_after_{};  // EMFILE back-off (server thread)
  std::atomic<bool> stopping_{false};
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

// What fetch_fd makes of a name nobody listens on (ECONNREFUSED, ENOENT).
enum class IfNobodyListens {
  kRetry,     // the server may not be up yet: retry until the timeout
  kPeerGone,  // it was up (bound before its name was published), so it is gone: fail at once
};

// Asks the server `name`, run by process `server_pid` under this process's
// effective uid, for descriptor `id`, presenting `secret`; the whole exchange
// (connect, request, reply) ends by `timeout` (under 1 ms counts as 1 ms).
// Anyone can bind an abstract name that is free (say, its server gone), so
// before sending anything fetch_fd checks who listens (SO_PEERCRED): another
// uid or pid gets neither the secret nor the chance to hand us a descriptor.
// Throws timeout_error naming the socket and id when nobody answered in time;
// logic_error when the socket is not `server_pid`'s, or the server refused us
// or has no such id; runtime_error at once when nobody listens and
// `if_nobody_listens` is kPeerGone.
int fetch_fd(const std::string& name, pid_t server_pid, const std::string& secret, std::uint64_t id,
             std::chrono::milliseconds timeout, IfNobodyListens if_nobody_listens = IfNobodyListens::kRetry);

}  // namespace symmpool
