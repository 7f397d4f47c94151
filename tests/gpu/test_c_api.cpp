// The C ABI that CUDAPluggableAllocator calls.

#include "gpu_skip.hpp"

#include <symmpool/c_api.h>

#include <string>

namespace symmpool::test {

TEST(CApi, MallocFreeRoundTrip) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  CUDA_OK(cudaSetDevice(0));
  void* p = symmpool_malloc(12345, 0, nullptr);
  ASSERT_NE(p, nullptr) << symmpool_last_error();
  CUDA_OK(cudaMemset(p, 1, 12345));
  symmpool_free(p, 12345, 0, nullptr);
  EXPECT_STREQ(symmpool_last_error(), "");
  EXPECT_GE(symmpool_empty_cache(0), 0);
}

TEST(CApi, ErrorsAreReportedNotThrown) {
  SYMMPOOL_SKIP_WITHOUT_GPUS(1);
  int x = 0;
  symmpool_free(&x, 4, 0, nullptr);
  EXPECT_NE(std::string(symmpool_last_error()).find("not allocated by symmpool"), std::string::npos)
      << symmpool_last_error();
  void* p = symmpool_malloc(12345, 0, nullptr);
  symmpool_free(p, 999, 0, nullptr);  // wrong size: refused, block stays live
  EXPECT_NE(std::string(symmpool_last_error()).find("allocated with size 12345"), std::string::npos);
  symmpool_free(p, 12345, 0, nullptr);
  EXPECT_EQ(symmpool_malloc(std::size_t{1} << 50, 0, nullptr), nullptr);
  EXPECT_NE(std::string(symmpool_last_error()).find("total memory"), std::string::npos);
  EXPECT_EQ(symmpool_malloc(16, 99, nullptr), nullptr);
  EXPECT_NE(std::string(symmpool_last_error()).find("device"), std::string::npos);
}

}  // namespace symmpool::test
