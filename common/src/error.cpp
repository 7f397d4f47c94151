#include <symmpool/error.hpp>

namespace symmpool::detail {

static std::string where(const char* file, int line) {
  return std::string("symmpool failure at ") + file + ":" + std::to_string(line) + ": ";
}

void throw_logic_error(const char* file, int line, const std::string& msg) {
  throw logic_error(where(file, line) + msg);
}

void throw_cuda_error(const char* file, int line, const char* call, CUresult code, const char* error_string) {
  throw cuda_error(where(file, line) + call + " failed with " + std::to_string(code) + " (" +
                       (error_string ? error_string : "unknown CUDA error") + ")",
                   code);
}

void throw_nccl_error(const char* file, int line, const char* call, int code, const char* error_string) {
  throw nccl_error(where(file, line) + call + " failed with " + std::to_string(code) + " (" +
                   (error_string ? error_string : "unknown NCCL error") + ")");
}

}  // namespace symmpool::detail
