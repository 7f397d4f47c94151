#include "call_end_word.hpp"

#include "stream_op_batch.hpp"

#include <symmpool/driver_api.hpp>
#include <symmpool/error.hpp>

namespace symmpool::detail {

std::unique_ptr<CallEndWord> CallEndWord::make_if_supported(int device) {
  const DriverApi& drv = real_driver();
  CUdevice dev = 0;
  int wide = 0;
  SYMMPOOL_CU_TRY(drv, cuDeviceGet(&dev, device));
  SYMMPOOL_CU_TRY(drv, cuDeviceGetAttribute(&wide, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
  if (wide == 0) return nullptr;
  std::uint64_t* word = nullptr;
  SYMMPOOL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&word), sizeof(*word), cudaHostAllocMapped));
  *word = 0;  // call numbers start at 1
  return std::unique_ptr<CallEndWord>(new CallEndWord(word));
}

CallEndWord::~CallEndWord() { cudaFreeHost(word_); }

void CallEndWord::make_wait(cudaStream_t stream, std::uint64_t call) const {
  StreamOpBatch batch;
  batch.wait_at_least64(reinterpret_cast<CUdeviceptr>(word_), call);
  batch.enqueue(real_driver(), reinterpret_cast<CUstream>(stream));
}

}  // namespace symmpool::detail
