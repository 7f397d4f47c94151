#pragma once
// File descriptors between processes of one node, over abstract Unix domain
// sockets (SCM_RIGHTS). A server thread answers "send me descriptor <id>"
// with a freshly exported descriptor; peers fetch lazily, when they map.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace symmpool {

class FdServer {
 public:
  // `export_fd(id)` returns a new descriptor for `id` (closed here once
  // sent), or -1 when there is no such id.
  FdServer(std::string name, std::function<int(std::uint64_t)> export_fd);
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& name() const { return name_; }

 private:
  void serve();

  std::string name_;
  std::function<int(std::uint64_t)> export_fd_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
};

// Asks the server `name` for descriptor `id`; retries the connection until
// `timeout`, then throws timeout_error. Throws logic_error if the server has
// no such id.
int fetch_fd(const std::string& name, std::uint64_t id, std::chrono::milliseconds timeout);

}  // namespace symmpool
