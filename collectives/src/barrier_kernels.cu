// The barrier, signal and wait kernels: one tiny launch each, meeting the
// peers on their signal pads (meeting_protocol.cuh).

#include "kernels.hpp"
#include "meeting_protocol.cuh"

namespace symmpool::detail {

namespace {

// Between copies or kernels of one collective: what came before on every
// rank is visible to what comes after on every rank. At a call's first
// meeting (signals.call) it also checks that every rank is at the same call
// with the same buffers. Where it fails, the kernels after it see the
// failed word and leave peers alone; copies after it run all the same, on a
// communicator that has failed.
__global__ void barrier_kernel(PeerSignals signals, int world, std::uint32_t* epoch_counter) {
  const std::uint32_t epoch = *epoch_counter + 1;
  const bool failed_before = has_failed(signals.failure);  // read beside the counter, not after it
  __syncwarp();  // every lane read the counter before lane 0 moves it on
  signal_and_wait(signals, world, kKernelBarrierRow, epoch, cuda::std::memory_order_release,
                  cuda::std::memory_order_acquire, signals.call, failed_before);
  if (threadIdx.x == 0) *epoch_counter = epoch;
}

__global__ void signal_kernel(PeerSignals signals, int peer, std::uint32_t* sent) {
  const std::uint32_t count = sent[peer] + 1;
  sent[peer] = count;
  signal(pick(signals.peers.peer, peer) + kSignalRow * kMaxRanks + signals.rank, count,
         cuda::std::memory_order_release);
}

__global__ void wait_kernel(PeerSignals signals, int peer, std::uint32_t* received) {
  const std::uint32_t count = received[peer] + 1;
  wait_for(signals.my_pads + kSignalRow * kMaxRanks + peer, count, cuda::std::memory_order_acquire, peer,
           signals.failure);
  received[peer] = count;
}

}  // namespace

cudaError_t launch_barrier(const PeerSignals& signals, int world, std::uint32_t* epoch_counter,
                           cudaStream_t stream) {
  barrier_kernel<<<1, 32, 0, stream>>>(signals, world, epoch_counter);
  return cudaGetLastError();
}

cudaError_t launch_signal(const PeerSignals& signals, int peer, std::uint32_t* sent, cudaStream_t stream) {
  signal_kernel<<<1, 1, 0, stream>>>(signals, peer, sent);
  return cudaGetLastError();
}

cudaError_t launch_wait(const PeerSignals& signals, int peer, std::uint32_t* received, cudaStream_t stream) {
  wait_kernel<<<1, 1, 0, stream>>>(signals, peer, received);
  return cudaGetLastError();
}

// The barrier, signal and wait kernels (kernels.hpp, load_*_kernels).
cudaError_t load_barrier_kernels() {
  const void* kernels[] = {reinterpret_cast<const void*>(barrier_kernel),
                           reinterpret_cast<const void*>(signal_kernel),
                           reinterpret_cast<const void*>(wait_kernel)};
  return load_kernels(kernels, sizeof kernels / sizeof kernels[0]);
}

}  // namespace symmpool::detail
