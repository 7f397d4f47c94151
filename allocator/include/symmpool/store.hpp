#pragma once
// Where ranks exchange metadata: a small key-value store. The torch bindings
// adapt c10d's store; C++-only users have FileStore (a shared directory).

#include <chrono>
#include <stdexcept>
#include <string>

namespace symmpool {

// A wait ran out: a peer never arrived or never published.
struct timeout_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The ranks of a group reached different collective points (their
// allocations or calls diverged): every rank that notices throws it.
struct divergence_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key`; throws timeout_error naming it.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Removes `key` if present, so long runs do not pile up keys.
  virtual void erase(const std::string& key) = 0;
};

// Keys are files in one directory that every rank sees (one node).
class FileStore final : public Store {
 public:
  explicit FileStore(std::string directory);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void erase(const std::string& key) override;

 private:
  std::string path_of(const std::string& key) const;
  std::string directory_;
};

}  // namespace symmpool
