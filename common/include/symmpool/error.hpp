#pragma once
// Errors, the RMM way: every exception type symmpool throws, and the macros
// that throw them with the failed call, file, line and the library's own
// error string. Callers catch these by type: not_symmetric_error and
// multi_node_error are the only ones that may mean "use NCCL instead".

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace symmpool {

// Bad input from the caller: invalid size, unknown pointer, double free...
struct logic_error : std::logic_error {
  using std::logic_error::logic_error;
};

// A CUDA driver call failed.
struct cuda_error : std::runtime_error {
  cuda_error(const std::string& what, CUresult code) : std::runtime_error(what), code_(code) {}
  CUresult code() const noexcept { return code_; }

 private:
  CUresult code_;
};

// The device ran out of memory even after the cache was emptied.
struct out_of_memory : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An NCCL call failed.
struct nccl_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A buffer is not at the same offset with the same size on every rank of a
// group (every rank sees the same verdict). The one error a caller may take
// as "run this call on NCCL instead": any other error is a real failure.
struct not_symmetric_error : logic_error {
  using logic_error::logic_error;
};

// The group's ranks are not all on one node: a heap cannot span nodes (its
// peers map each other's memory). Every rank throws it, so callers can agree
// to use NCCL instead.
struct multi_node_error : logic_error {
  using logic_error::logic_error;
};

// A wait ran out: a peer never arrived or never published.
struct timeout_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The rendezvous store itself failed (its server is gone or unreachable):
// no rank can be said to be late, so none is named as such.
struct store_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The ranks of a group reached different collective points (their
// allocations or calls diverged): every rank that notices throws it.
struct divergence_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A collective failed (a peer never arrived, the group's ranks diverged) and
// the communicator is unusable: every later call raises this again.
struct collective_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_logic_error(const char* file, int line, const std::string& msg);
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, CUresult code,
                                   const char* error_string);
[[noreturn]] void throw_nccl_error(const char* file, int line, const char* call, int code,
                                   const char* error_string);
}  // namespace detail

}  // namespace symmpool

#define SYMMPOOL_STRINGIFY_DETAIL(x) #x
#define SYMMPOOL_STRINGIFY(x) SYMMPOOL_STRINGIFY_DETAIL(x)

// Throws symmpool::logic_error carrying `msg` (anything streamable into std::string +).
#define SYMMPOOL_EXPECTS(cond, msg)                                                \
  do {                                                                             \
    if (!(cond)) ::symmpool::detail::throw_logic_error(__FILE__, __LINE__, (msg)); \
  } while (0)

#define SYMMPOOL_FAIL(msg) ::symmpool::detail::throw_logic_error(__FILE__, __LINE__, (msg))

// Calls `call` through the driver table `drv` (a symmpool::DriverApi) and
// throws symmpool::cuda_error on failure: SYMMPOOL_CU_TRY(drv, cuMemMap(...)).
#define SYMMPOOL_CU_TRY(drv, call)                                                         \
  do {                                                                                     \
    CUresult symmpool_cu_status_ = (drv).call;                                             \
    if (symmpool_cu_status_ != CUDA_SUCCESS)                                               \
      ::symmpool::detail::throw_cuda_error(__FILE__, __LINE__, #call, symmpool_cu_status_, \
                                           (drv).error_string(symmpool_cu_status_));       \
  } while (0)

// Calls `call` through the NCCL table `nccl` (a symmpool::NcclApi) and throws
// symmpool::nccl_error on failure.
#define SYMMPOOL_NCCL_TRY(nccl, call)                                                   \
  do {                                                                                  \
    auto symmpool_nccl_status_ = (nccl).call;                                           \
    if (symmpool_nccl_status_ != 0)                                                     \
      ::symmpool::detail::throw_nccl_error(__FILE__, __LINE__, #call,                   \
                                           static_cast<int>(symmpool_nccl_status_),     \
                                           (nccl).error_string(symmpool_nccl_status_)); \
  } while (0)

// A CUDA runtime call that throws symmpool::cuda_error with the call and the
// runtime's error string (code() then holds the cudaError_t value). Driver
// calls go through SYMMPOOL_CU_TRY: they use the driver table, real or fake.
#define SYMMPOOL_CUDA_TRY(call)                                                        \
  do {                                                                                 \
    cudaError_t symmpool_rt_status_ = (call);                                          \
    if (symmpool_rt_status_ != cudaSuccess)                                            \
      ::symmpool::detail::throw_cuda_error(__FILE__, __LINE__, #call,                  \
                                           static_cast<CUresult>(symmpool_rt_status_), \
                                           cudaGetErrorString(symmpool_rt_status_));   \
  } while (0)
