#pragma once
// Where ranks exchange metadata: a small key-value store. The torch bindings
// adapt c10d's store; C++-only users have FileStore (a shared directory).

#include <symmpool/error.hpp>  // timeout_error

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace symmpool {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key`; throws timeout_error naming it, or
  // store_error when the store itself cannot be reached (any call may).
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Removes `key` if present, so long runs do not pile up keys.
  virtual void erase(const std::string& key) = 0;
  // Whether `key` is set now (no waiting).
  virtual bool contains(const std::string& key) = 0;
};

// Keys are files in one directory that every rank sees (one node). The
// directory may be on a shared machine, so it must be private: it is created
// 0700 when missing, and one that is a symlink, owned by another user, or
// group- or world-writable is refused (symmpool::logic_error). Every file
// operation goes through the directory's fd and never follows a symlink.
// A key's '/' become '%' (one flat directory); "", ".", ".." and keys with
// NUL are refused.
class FileStore final : public Store {
 public:
  // Values larger than this are refused, on set and on get.
  static constexpr std::size_t kMaxValueBytes = std::size_t{64} << 20;

  explicit FileStore(std::string directory);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void erase(const std::string& key) override;
  bool contains(const std::string& key) override;

 private:
  std::string file_name(const std::string& key) const;
  // The value of `key`, or false while it does not exist yet.
  bool try_read(const std::string& key, const std::string& name, std::string& value) const;
  std::string directory_;
  int dir_fd_ = -1;
};

// A fresh private directory for a FileStore (mkdtemp: 0700, unique name),
// removed with the files in it when this goes out of scope. Only the process
// that made it removes it: a fork()ed child that inherits a copy (and exits
// normally) leaves it to the parent, which should outlive its children.
class TempStoreDir {
 public:
  explicit TempStoreDir(const std::string& prefix = "/tmp/symmpool-store-");
  ~TempStoreDir();
  TempStoreDir(const TempStoreDir&) = delete;
  TempStoreDir& operator=(const TempStoreDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  pid_t owner_;
};

}  // namespace symmpool
