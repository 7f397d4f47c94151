#include <symmpool/node_identity.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

namespace symmpool {

namespace {

std::string without_whitespace(std::string s) {
  std::replace_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c) != 0; }, '_');
  return s;
}

// Distinguishes containers that share a hostname on different machines.
// POSIX reads.
std::string boot_id() {
  char buf[64] = {};
  const int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  std::string id(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
  return id;
}

}  // namespace

std::string node_identity(const std::string& host_id) {
  if (!host_id.empty()) return without_whitespace(host_id);
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return without_whitespace(std::string(host[0] ? host : "unknown-host") + "/" + boot_id());
}

}  // namespace symmpool
