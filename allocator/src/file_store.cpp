#include <symmpool/error.hpp>
#include <symmpool/store.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
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
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), static_cast<std::streamsize>(value.size()));
    SYMMPOOL_EXPECTS(f.good(), "FileStore cannot write " + tmp);
  }
  SYMMPOOL_EXPECTS(std::rename(tmp.c_str(), path.c_str()) == 0, "FileStore cannot publish " + path);
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      std::ostringstream s;
      s << f.rdbuf();
      return s.str();
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw timeout_error("symmpool: timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for store key '" + key + "'");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace symmpool
