#include <symmpool/random_token.hpp>

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <vector>

namespace symmpool {

namespace {

// Fills `buf` from /dev/urandom: for kernels without getrandom(2).
void read_urandom(unsigned char* buf, std::size_t n) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "symmpool: open /dev/urandom");
  while (n > 0) {
    const ssize_t r = ::read(fd, buf, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      ::close(fd);
      throw std::system_error(err, std::generic_category(), "symmpool: read /dev/urandom");
    }
    buf += r;
    n -= static_cast<std::size_t>(r);
  }
  ::close(fd);
}

void fill_random(unsigned char* buf, std::size_t n) {
  while (n > 0) {
    const ssize_t r = ::getrandom(buf, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == ENOSYS) return read_urandom(buf, n);
    if (r < 0) throw std::system_error(errno, std::generic_category(), "symmpool: getrandom");
    buf += r;
    n -= static_cast<std::size_t>(r);
  }
}

}  // namespace

std::string random_token(std::size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  fill_random(raw.data(), raw.size());
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes);
  for (unsigned char b : raw) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

bool is_hex_token(const std::string& text, std::size_t max_chars) {
  if (text.empty() || text.size() > max_chars) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace symmpool
