#include <symmpool/detail/deadline.hpp>
#include <symmpool/detail/scope_exit.hpp>
#include <symmpool/error.hpp>
#include <symmpool/store.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

namespace symmpool {

namespace {

std::string error_text() { return std::strerror(errno); }

std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Why the opened directory `st` must not hold a store ("" when it may): on a
// shared machine anyone who can write in it can plant or swap keys.
std::string why_not_private(const std::string& path, const struct stat& st) {
  const std::string what = "FileStore directory " + path + " (owner uid " + std::to_string(st.st_uid) +
                           ", mode " + octal_mode(st.st_mode) + ")";
  if (!S_ISDIR(st.st_mode)) return what + " is not a directory";
  if (st.st_uid != ::geteuid())
    return what + " is owned by another user than this process's uid " + std::to_string(::geteuid()) +
           "; use a directory of your own";
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return what + " is group- or world-writable; a store directory must be private (0700)";
  return "";
}

// A key as it may appear in a message: NUL made visible.
std::string printable(const std::string& key) {
  std::string out;
  for (char c : key) out += c == '\0' ? std::string("\\0") : std::string(1, c);
  return out;
}

bool write_all(int fd, const std::string& value) {
  std::size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// Creates a temp file for `name` in `dir_fd` that nobody else has: O_EXCL
// neither reuses an existing file nor follows a planted symlink.
int create_temp(int dir_fd, const std::string& name, std::string& tmp) {
  const std::string base = name + ".tmp." + std::to_string(::getpid());
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = attempt == 0 ? base : base + "." + std::to_string(attempt);
    const int fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return -1;
  }
  errno = EEXIST;
  return -1;
}

// Removes what the directory `fd` holds, subdirectories included, never
// following a symlink; closes `fd`.
void remove_contents(int fd) {
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    ::close(fd);
    return;
  }
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
      const int sub = ::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) remove_contents(sub);
      ::unlinkat(fd, name.c_str(), AT_REMOVEDIR);
    } else {
      ::unlinkat(fd, name.c_str(), 0);
    }
  }
  ::closedir(dir);
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  if (::mkdir(directory_.c_str(), 0700) != 0 && errno != EEXIST)
    SYMMPOOL_FAIL("FileStore directory " + directory_ + " cannot be created: " + error_text());
  struct stat st {};
  SYMMPOOL_EXPECTS(::lstat(directory_.c_str(), &st) == 0,
                   "FileStore directory " + directory_ + " cannot be examined: " + error_text());
  SYMMPOOL_EXPECTS(!S_ISLNK(st.st_mode), "FileStore directory " + directory_ + " (owner uid " +
                                             std::to_string(st.st_uid) +
                                             ") is a symbolic link; give the real directory");
  // O_NOFOLLOW and checking what was opened (fstat) leave no gap between
  // the check and the use for anyone to swap the directory in.
  dir_fd_ = ::open(directory_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  SYMMPOOL_EXPECTS(dir_fd_ >= 0, "FileStore directory " + directory_ + " cannot be opened: " + error_text());
  std::string problem = ::fstat(dir_fd_, &st) == 0
                            ? why_not_private(directory_, st)
                            : "FileStore directory " + directory_ + ": " + error_text();
  if (!problem.empty()) {
    ::close(dir_fd_);
    SYMMPOOL_FAIL(problem);
  }
}

FileStore::~FileStore() { ::close(dir_fd_); }

std::string FileStore::file_name(const std::string& key) const {
  SYMMPOOL_EXPECTS(
      !key.empty() && key != "." && key != ".." && key.find('\0') == std::string::npos,
      "FileStore key '" + printable(key) + "' is not allowed (empty, \".\", \"..\" or with NUL)");
  std::string name = key;
  std::replace(name.begin(), name.end(), '/', '%');  // one flat directory
  return name;
}

void FileStore::set(const std::string& key, const std::string& value) {
  const std::string name = file_name(key);
  SYMMPOOL_EXPECTS(value.size() <= kMaxValueBytes,
                   "FileStore value of key '" + key + "' is " + std::to_string(value.size()) +
                       " bytes, more than the " + std::to_string(kMaxValueBytes) + " allowed");
  // Write then rename, so a reader sees the whole value or nothing.
  std::string tmp;
  const int fd = create_temp(dir_fd_, name, tmp);
  SYMMPOOL_EXPECTS(fd >= 0, "FileStore cannot create a temp file for key '" + key + "' in " + directory_ +
                                ": " + error_text());
  detail::ScopeExit drop_tmp([&] { ::unlinkat(dir_fd_, tmp.c_str(), 0); });
  const bool written = write_all(fd, value);
  SYMMPOOL_EXPECTS(::close(fd) == 0 && written,
                   "FileStore cannot write " + directory_ + "/" + tmp + ": " + error_text());
  SYMMPOOL_EXPECTS(::renameat(dir_fd_, tmp.c_str(), dir_fd_, name.c_str()) == 0,
                   "FileStore cannot publish " + directory_ + "/" + name + ": " + error_text());
  drop_tmp.dismiss();
}

bool FileStore::try_read(const std::string& key, const std::string& name, std::string& value) const {
  // O_NONBLOCK: a planted FIFO must not block the open (fstat refuses it).
  const int fd = ::openat(dir_fd_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return false;
  SYMMPOOL_EXPECTS(fd >= 0, "FileStore cannot open key '" + key + "' in " + directory_ + ": " +
                                (errno == ELOOP ? std::string("it is a symbolic link") : error_text()));
  detail::ScopeExit close_fd([fd] { ::close(fd); });
  struct stat st {};
  SYMMPOOL_EXPECTS(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid(),
                   "FileStore key '" + key + "' in " + directory_ + " is not a regular file of this user");
  const std::string too_big = "FileStore value of key '" + key + "' in " + directory_ +
                              " is larger than the " + std::to_string(kMaxValueBytes) + " bytes allowed";
  SYMMPOOL_EXPECTS(static_cast<std::size_t>(st.st_size) <= kMaxValueBytes, too_big);
  value.clear();
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    SYMMPOOL_EXPECTS(n >= 0,
                     "FileStore cannot read key '" + key + "' in " + directory_ + ": " + error_text());
    if (n == 0) return true;
    SYMMPOOL_EXPECTS(value.size() + static_cast<std::size_t>(n) <= kMaxValueBytes, too_big);
    value.append(buf, static_cast<std::size_t>(n));
  }
}

bool FileStore::contains(const std::string& key) {
  std::string value;
  return try_read(key, file_name(key), value);
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string name = file_name(key);
  const auto deadline = detail::deadline_after(timeout);
  for (;;) {
    std::string value;
    if (try_read(key, name, value)) return value;
    if (std::chrono::steady_clock::now() >= deadline)
      throw timeout_error("symmpool: timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for store key '" + key + "'");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void FileStore::erase(const std::string& key) {
  const std::string name = file_name(key);
  SYMMPOOL_EXPECTS(::unlinkat(dir_fd_, name.c_str(), 0) == 0 || errno == ENOENT,
                   "FileStore cannot erase key '" + key + "' in " + directory_ + ": " + error_text());
}

TempStoreDir::TempStoreDir(const std::string& prefix) : path_(prefix + "XXXXXX"), owner_(::getpid()) {
  SYMMPOOL_EXPECTS(::mkdtemp(path_.data()) != nullptr,
                   "cannot create a temporary store directory " + path_ + ": " + error_text());
}

TempStoreDir::~TempStoreDir() {
  if (::getpid() != owner_) return;  // a fork()ed child's copy
  const int fd = ::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) remove_contents(fd);
  ::rmdir(path_.c_str());
}

}  // namespace symmpool
