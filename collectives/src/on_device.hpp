#pragma once
// Makes a communicator's device current for a scope, whichever one the
// thread had (a call from another thread, or a group made without
// set_device), and gives the thread's own back at the scope's end.

#include <symmpool/error.hpp>

#include <cuda_runtime_api.h>

#include <new>

namespace symmpool::detail {

class OnDevice {
 public:
  // Throws where CUDA refuses to say or to switch.
  explicit OnDevice(int device) {
    SYMMPOOL_CUDA_TRY(cudaGetDevice(&caller_));
    if (caller_ == device) return;
    SYMMPOOL_CUDA_TRY(cudaSetDevice(device));
    switched_ = true;
  }
  // Where CUDA refuses, stays where it is (a destructor's way: it goes on).
  OnDevice(int device, std::nothrow_t) noexcept {
    switched_ =
        cudaGetDevice(&caller_) == cudaSuccess && caller_ != device && cudaSetDevice(device) == cudaSuccess;
  }
  ~OnDevice() {
    if (switched_) cudaSetDevice(caller_);
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int caller_ = -1;
  bool switched_ = false;
};

}  // namespace symmpool::detail
