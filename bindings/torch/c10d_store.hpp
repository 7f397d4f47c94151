#pragma once
// symmpool::Store over the process group's c10d store, so the symmetric heap
// exchanges its metadata where torch.distributed already rendezvoused.

#include <symmpool/store.hpp>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace symmpool::torch_ext {

class C10dStore final : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
    } catch (const c10::Error& e) {
      throw timeout_error("symmpool: waiting " + std::to_string(timeout.count()) + " ms for store key '" +
                          key + "' failed: " + e.what_without_backtrace());
    }
    auto value = store_->get(key);
    return std::string(value.begin(), value.end());
  }

  bool contains(const std::string& key) override { return store_->check({key}); }

  void erase(const std::string& key) override {
    if (!can_erase_) return;
    try {
      store_->deleteKey(key);
    } catch (const c10::Error&) {
      can_erase_ = false;  // a store without deleteKey keeps its keys
    }
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  bool can_erase_ = true;
};

}  // namespace symmpool::torch_ext
