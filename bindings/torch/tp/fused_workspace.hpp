#pragma once
// The fused ops' workspace: one symmetric staging buffer per group and
// device, the group's copy stream, where the last op left the buffer, and
// how it grows (collective: every rank allocates, then a rendezvous decides
// whether the new buffer is symmetric, the same verdict on every rank).

#include "c10d/peer_group.hpp"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace symmpool::torch_ext {

// A stream of the workspace's own, made on `device` (non-blocking, as
// torch's pool streams are) and destroyed with it.
class OwnStream {
 public:
  explicit OwnStream(c10::DeviceIndex device);
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  ~OwnStream();

  c10::cuda::CUDAStream get() const { return c10::cuda::getStreamFromExternal(stream_, device_); }

 private:
  c10::DeviceIndex device_;
  cudaStream_t stream_ = nullptr;
};

struct FusedWorkspace {
  // The group's copy stream is its own: it carries the group's first
  // meeting, and a stream shared with another group (torch's pool hands its
  // 32 streams out in turn) could order two groups' meetings differently on
  // two ranks (a cycle).
  FusedWorkspace(c10::DeviceIndex device, std::uint64_t group_serial);

  bool holds(std::int64_t nbytes) const { return buffer.defined() && buffer.numel() >= nbytes; }
  // Takes `tensor` (rendezvoused, uint8) as the buffer, in stream order on
  // the current stream: the next op, on whatever stream, waits for that.
  void set_buffer(const at::Tensor& tensor);
  // `stream` is where the buffer was last used, as of now.
  void record_use(const c10::cuda::CUDAStream& stream);

  at::Tensor buffer;  // uint8, rendezvoused; undefined until the first growth
  OwnStream own_copies;
  c10::cuda::CUDAStream copies;
  // The copy stream of ops being captured: a stream a capture forked stays
  // in that capture until it ends, so an eager op meanwhile (on another
  // stream) must not fork `copies` again from outside it.
  OwnStream own_captured_copies;
  c10::cuda::CUDAStream captured_copies;
  at::cuda::CUDAEvent last_use;               // on the stream that last used `buffer`, after that use
  cudaStream_t last_use_stream = nullptr;     // that stream: an op on it again needs no wait
  at::cuda::CUDAEvent joined;                 // one stream's work so far, for another to wait on
  std::array<at::cuda::CUDAEvent, 2> pushed;  // a staging buffer's push has landed
  bool captured = false;                      // a CUDA graph replays on `buffer`'s addresses

  const std::uint64_t id;                   // unique in the process (tests: was it replaced?)
  const std::uint64_t group_serial;         // a new group under an old name gets a new workspace
  std::string not_symmetric;                // why the last growth was refused (same text on every rank)
  std::int64_t refused_bytes = 0;           // up to this size, larger than `buffer`, calls go unfused
  std::vector<at::Tensor> kept_for_graphs;  // outgrown but captured: never freed
};

// The workspace of group `group_name` (whose peer side is `peers`) on
// `device`, grown to `nbytes` where it can be: collective when it grows, so
// every rank must ask for the same size. holds(nbytes) is false, on every
// rank, when the larger buffer came out asymmetric (or did not fit in
// memory on some rank). Raises when it would grow during a graph capture.
// A group's fused ops are issued from one thread at a time, as a NCCL
// communicator's calls are; the handle keeps a workspace alive through a
// call even if a new group under the same name replaces it.
std::shared_ptr<FusedWorkspace> fused_workspace(PeerGroup& peers, const std::string& group_name,
                                                c10::DeviceIndex device, std::int64_t nbytes);

// Drops the workspaces of the group whose PeerGroup has `group_serial`
// (it is going: shutdown, abort, destruction, release), once nothing on the
// GPU can use them any more: the caller has synchronized the device. Their
// buffers go back to symmpool's allocator, except those a CUDA graph
// captured, which stay allocated for the process's life (a graph replays on
// their addresses). A call still holding a workspace keeps it until it returns.
void release_fused_workspaces(std::uint64_t group_serial);

// The workspace of `group_name` on `device` if one was made (tests), else null.
std::shared_ptr<FusedWorkspace> existing_fused_workspace(const std::string& group_name,
                                                         c10::DeviceIndex device);

}  // namespace symmpool::torch_ext
