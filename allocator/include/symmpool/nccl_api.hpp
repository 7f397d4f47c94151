#pragma once
// The NCCL calls symmpool makes, through function pointers, so that a torch
// process uses the NCCL that torch loaded and tests can swap in a fake.

#include <nccl.h>

namespace symmpool {

struct NcclApi {
  decltype(&::ncclCommRegister) commRegister = nullptr;
  decltype(&::ncclCommDeregister) commDeregister = nullptr;
  decltype(&::ncclGetErrorString) getErrorString = nullptr;
  // Symmetric windows (NCCL 2.27 and newer); null where the loaded NCCL has none.
  decltype(&::ncclCommWindowRegister) commWindowRegister = nullptr;
  decltype(&::ncclCommWindowDeregister) commWindowDeregister = nullptr;
  int version = 0;  // as ncclGetVersion gives it (22809 for 2.28.9); 0 when unknown

  const char* error_string(ncclResult_t code) const;
  bool has_windows() const { return commWindowRegister != nullptr && commWindowDeregister != nullptr; }
};

// The NCCL already loaded in this process (libnccl.so.2 by soname, e.g.
// torch's), or else the one the dynamic linker finds. Throws nccl_error
// naming what is missing.
const NcclApi& loaded_nccl();

}  // namespace symmpool
