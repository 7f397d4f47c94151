#include <symmpool/error.hpp>
#include <symmpool/store.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

namespace symmpool {

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  ::mkdir(directory_.c_str(), 0700);
  struct stat st {};
  SYMMPOOL_EXPECTS(::stat(directory_.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
                   "FileStore directory " + directory_ + " cannot be created");
}

std::string FileStore::path_of(const std::string& key) const {
  std::string name;
  for (char c : key) name += (c == '/') ? '%' : c;  // one flat directory
  return directory_ + "/" + name;
}

void FileStore::set(const std::string& key, const std::string& value) {
  // Write then rename, so a reader sees the whole value or nothing.
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  SYMMPOOL_EXPECTS(f != nullptr, "FileStore cannot create " + tmp);
  const bool written = std::fwrite(value.data(), 1, value.size(), f) == value.size();
  SYMMPOOL_EXPECTS(std::fclose(f) == 0 && written, "FileStore cannot write " + tmp);
  SYMMPOOL_EXPECTS(std::rename(tmp.c_str(), path.c_str()) == 0, "FileStore cannot publish " + path);
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      std::string value;
      char buf[4096];
      std::size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) value.append(buf, n);
      std::fclose(f);
      return value;
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw timeout_error("symmpool: timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for store key '" + key + "'");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void FileStore::erase(const std::string& key) { std::remove(path_of(key).c_str()); }

}  // namespace symmpool
