#pragma once
// The storages a group's rendezvous accepted. Inside a torch MemPool, torch's
// caching allocator hands a freed block to the next tensor without symmpool
// seeing the free, so symmpool's own allocation serials cannot tell a new
// tensor from the one that was rendezvoused at the same address. A storage is
// torch's unit of lifetime: a peer view is given only for a storage that went
// through rendezvous itself (any view of it counts). Thread-safe.

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/util/intrusive_ptr.h>

#include <iterator>
#include <mutex>
#include <unordered_map>

namespace symmpool::torch_ext {

class RendezvousedStorages {
 public:
  void add(const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = storages_.begin(); it != storages_.end();)  // forget the freed ones
      it = it->second.expired() ? storages_.erase(it) : std::next(it);
    const c10::Storage& storage = t.storage();
    storages_.insert_or_assign(storage.unsafeGetStorageImpl(), storage.getWeakStorageImpl());
  }

  bool contains(const at::Tensor& t) const {
    std::lock_guard<std::mutex> lock(mutex_);
    c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    auto it = storages_.find(impl);
    // An expired entry whose address a new storage now has must not count.
    return it != storages_.end() && it->second.lock().get() == impl;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> storages_;
};

}  // namespace symmpool::torch_ext
