#pragma once
// The failure of one communicator, shared with the Works of its collectives
// (which may outlive it): empty until it fails, then fixed.

#include <mutex>
#include <string>

namespace symmpool::detail {

class FailureRecord {
 public:
  std::string message() const;
  bool failed() const;
  // First call wins; returns whether this one did.
  bool set(const std::string& message);

 private:
  mutable std::mutex mutex_;
  std::string message_;
};

}  // namespace symmpool::detail
