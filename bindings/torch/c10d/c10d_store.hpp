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
    guarded("setting", key, [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }

  // A key that did not come in time is a timeout_error (the heap names the
  // rank that never arrived); a store that cannot be reached (its server,
  // rank 0's TCPStore, died) is a store_error, blaming no rank.
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const std::string doing = "waiting " + std::to_string(timeout.count()) + " ms for";
    try {
      guarded(doing, key, [&] { store_->wait({key}, timeout); });
    } catch (const c10::Error& e) {  // a store_error passes: it is no c10::Error
      throw timeout_error("symmpool: " + doing + " store key '" + key +
                          "' failed: " + e.what_without_backtrace());
    }
    std::vector<uint8_t> value;
    guarded("reading", key, [&] { value = store_->get(key); });
    return std::string(value.begin(), value.end());
  }

  bool contains(const std::string& key) override {
    bool found = false;
    guarded("checking", key, [&] { found = store_->check({key}); });
    return found;
  }

  void erase(const std::string& key) override {
    if (!can_erase_) return;
    try {
      store_->deleteKey(key);
    } catch (const c10::Error&) {
      // A store without deleteKey keeps its keys. (A gone store, too: the
      // next set or get says so.)
      can_erase_ = false;
    }
  }

 private:
  // Runs a store call; a network failure becomes a store_error naming the key.
  template <typename F>
  static void guarded(const std::string& doing, const std::string& key, F call) {
    try {
      call();
    } catch (const c10::DistNetworkError& e) {
      throw store_error("symmpool: the store failed while " + doing + " key '" + key +
                        "' (its server may be gone): " + e.what_without_backtrace());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  bool can_erase_ = true;
};

}  // namespace symmpool::torch_ext
