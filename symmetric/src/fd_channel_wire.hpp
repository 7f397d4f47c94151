#pragma once
// What the descriptor server (fd_server.cpp) and its clients
// (fd_channel.cpp) share: the request's wire format, the socket address,
// waits with a deadline, and a descriptor closed on scope exit.

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

namespace symmpool::fd_wire {

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

inline milliseconds at_least_min(milliseconds t) { return std::max(t, kMinTimeout); }

// Abstract namespace: no file to clean up, gone with the process.
inline sockaddr_un address_of(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  SYMMPOOL_EXPECTS(!name.empty() && name.size() + 1 < sizeof(addr.sun_path),
                   "bad descriptor socket name '" + name + "'");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

inline std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

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

inline int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, kMaxPoll.count() * 10));
}

// Waits until `fd` reports `events` (or an error/hang-up); false at the deadline.
inline bool wait_for(int fd, short events, Clock::time_point deadline) {
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
inline void send_reply(int conn, Status status, int fd) {
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
inline bool equal_constant_time(const char* a, const char* b, std::size_t n) {
  unsigned char diff = 0;
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

inline std::string encode_request(const std::string& secret, std::uint64_t id) {
  std::string req(kMagic, sizeof kMagic);
  req += secret;
  for (int i = 0; i < 8; ++i) req += static_cast<char>((id >> (8 * i)) & 0xff);
  return req;
}

inline std::uint64_t decode_id(const char* bytes) {
  std::uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id |= std::uint64_t(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return id;
}

}  // namespace symmpool::fd_wire
