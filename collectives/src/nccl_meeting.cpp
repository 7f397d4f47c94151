// The meeting before NCCL runs a collective on buffers in its symmetric
// windows: NCCL takes every rank's word that its buffer sits at the same
// offset, so symmpool checks it first, as it does for its own kernels.

#include <symmpool/communicator.hpp>
#include <symmpool/error.hpp>

#include <algorithm>

namespace symmpool {

bool Communicator::meet_before_nccl(const char* op, const void* in, std::size_t in_bytes, const void* out,
                                    std::size_t out_bytes, cudaStream_t stream) {
  check_errors();
  begin_call(op);
  try {
    in_order(stream, op, std::max(in_bytes, out_bytes), [&] {
      require_symmetric(in, in_bytes, "input");
      if (out != in || out_bytes != in_bytes) require_symmetric(out, out_bytes, "output");
      // The call's first meeting compares its digest (its number and the
      // buffers' offsets, call_check.hpp) with every peer's. The second
      // keeps a peer from writing its next call's digest before this rank
      // compared: NCCL's kernel, on its own stream, orders nothing here.
      enqueue_barrier(stream, BarrierKind::kKernel);
      enqueue_barrier(stream, BarrierKind::kKernel);
    });
  } catch (const not_symmetric_error&) {
    return false;  // the same verdict on every rank
  }
  return true;
}

}  // namespace symmpool
