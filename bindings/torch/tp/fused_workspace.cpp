#include "tp/fused_workspace.hpp"

#include "c10d/group_teardown.hpp"
#include "stream_capture.hpp"
#include "tp/peer_memory.hpp"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace symmpool::torch_ext {

namespace {

constexpr std::int64_t kGranule = 2 << 20;  // bytes: workspaces grow in whole granules of the heap

struct Registry {
  std::mutex mutex;
  std::map<std::pair<std::string, c10::DeviceIndex>, std::shared_ptr<FusedWorkspace>> workspaces;
  std::vector<at::Tensor> kept_for_graphs;  // of released workspaces: never freed
};

// Never destroyed: a workspace's buffer goes back to symmpool's allocator,
// which may be gone when static objects are destroyed at exit.
Registry& registry() {
  static auto* r = new Registry();
  return *r;
}

std::atomic<std::uint64_t> next_workspace_id{1};

}  // namespace

FusedWorkspace::FusedWorkspace(c10::DeviceIndex device, std::uint64_t group_serial)
    : own_copies(device),
      copies(own_copies.get()),
      own_captured_copies(device),
      captured_copies(own_captured_copies.get()),
      id(next_workspace_id++),
      group_serial(group_serial) {}

OwnStream::OwnStream(c10::DeviceIndex device) : device_(device) {
  c10::cuda::CUDAGuard guard(device);
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

// Pending work still runs; at exit CUDA may be gone: ignored.
OwnStream::~OwnStream() { cudaStreamDestroy(stream_); }

void FusedWorkspace::set_buffer(const at::Tensor& tensor) {
  buffer = tensor;
  captured = false;
  record_use(c10::cuda::getCurrentCUDAStream(tensor.device().index()));
}

void FusedWorkspace::record_use(const c10::cuda::CUDAStream& stream) {
  last_use.record(stream);
  last_use_stream = stream.stream();
}

void release_fused_workspaces(std::uint64_t group_serial) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto it = r.workspaces.begin(); it != r.workspaces.end();) {
    FusedWorkspace& ws = *it->second;
    if (ws.group_serial != group_serial) {
      ++it;
      continue;
    }
    for (at::Tensor& kept : ws.kept_for_graphs) r.kept_for_graphs.push_back(std::move(kept));
    if (ws.captured && ws.buffer.defined()) r.kept_for_graphs.push_back(ws.buffer);
    it = r.workspaces.erase(it);
  }
}

// Every group's teardown lets its workspaces go (group_teardown.hpp).
[[maybe_unused]] const bool released_at_group_teardown =
    (on_group_teardown("releasing the fused-op workspaces", &release_fused_workspaces), true);

std::shared_ptr<FusedWorkspace> existing_fused_workspace(const std::string& group_name,
                                                         c10::DeviceIndex device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.workspaces.find({group_name, device});
  return it == r.workspaces.end() ? nullptr : it->second;
}

std::shared_ptr<FusedWorkspace> fused_workspace(PeerGroup& peers, const std::string& group_name,
                                                c10::DeviceIndex device, std::int64_t nbytes) {
  std::shared_ptr<FusedWorkspace> ws;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto& slot = r.workspaces[{group_name, device}];
    if (!slot || slot->group_serial != peers.serial())
      slot = std::make_shared<FusedWorkspace>(device, peers.serial());
    ws = slot;
  }
  if (ws->holds(nbytes) || nbytes <= ws->refused_bytes) return ws;
  const std::int64_t have = ws->buffer.defined() ? ws->buffer.numel() : 0;
  TORCH_CHECK(!is_capturing(c10::cuda::getCurrentCUDAStream(device)),
              "symmpool fused ops: the workspace of group '", group_name, "' holds ", have, " bytes, ",
              nbytes,
              " are needed, and it cannot grow during a CUDA graph capture; call symmpool.reserve_workspace(",
              nbytes, ", group) on every rank before capturing");
  const std::int64_t size = (nbytes + kGranule - 1) / kGranule * kGranule;
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(at::Device(at::kCUDA, device));
  at::Tensor tensor;
  try {
    tensor = peers.allocate_symmetric(size, bytes);
  } catch (const c10::OutOfMemoryError&) {
    // The peers are entering the rendezvous below: join them with a byte
    // outside the workspace's shape, so that every rank gets the same "not
    // symmetric" verdict and runs unfused, none left waiting.
    TORCH_WARN("symmpool fused ops: no memory for a ", size, "-byte workspace of group '", group_name,
               "' on rank ", peers.group_rank(), "; calls that need it run unfused");
    tensor = at::empty({1}, bytes);
  }
  std::string why_not = rendezvous_or_why_not(peers, tensor);
  if (!why_not.empty()) {  // the old one, if any, keeps serving what it holds
    ws->not_symmetric = std::move(why_not);
    ws->refused_bytes = size;
    return ws;
  }
  if (ws->buffer.defined()) {
    // Our streams are done with it; end barriers: the peers are too.
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::device_synchronize();
    if (ws->captured) ws->kept_for_graphs.push_back(ws->buffer);  // graphs replay on its addresses
  }
  ws->set_buffer(tensor);
  ws->not_symmetric.clear();
  ws->refused_bytes = 0;
  return ws;
}

}  // namespace symmpool::torch_ext
