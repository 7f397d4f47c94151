#include <symmpool/error.hpp>
#include <symmpool/nccl_api.hpp>

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace symmpool {

const char* NcclApi::error_string(ncclResult_t code) const {
  return getErrorString ? getErrorString(code) : "unknown NCCL error";
}

namespace {

template <typename Fn>
void resolve(void* library, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (fn == nullptr)
    throw nccl_error(std::string("symmpool: the loaded NCCL has no ") + name +
                     " (NCCL 2.19 or newer is needed)");
}

NcclApi load() {
  // Prefer the copy already in the process: two NCCLs in one process do not
  // share communicators.
  void* library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) library = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) throw nccl_error(std::string("symmpool: cannot load libnccl.so.2: ") + dlerror());
  NcclApi api;
  resolve(library, api.commRegister, "ncclCommRegister");
  resolve(library, api.commDeregister, "ncclCommDeregister");
  resolve(library, api.getErrorString, "ncclGetErrorString");
  // Optional: windows came with 2.27; an older NCCL still registers locally.
  api.commWindowRegister =
      reinterpret_cast<decltype(api.commWindowRegister)>(dlsym(library, "ncclCommWindowRegister"));
  api.commWindowDeregister =
      reinterpret_cast<decltype(api.commWindowDeregister)>(dlsym(library, "ncclCommWindowDeregister"));
  if (auto get_version = reinterpret_cast<decltype(&::ncclGetVersion)>(dlsym(library, "ncclGetVersion")))
    if (get_version(&api.version) != ncclSuccess) api.version = 0;
  return api;
}

}  // namespace

const NcclApi& loaded_nccl() {
  static std::once_flag once;
  static NcclApi api;
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace symmpool
