#include "fused_one_shot.hpp"

#include "torch_errors.hpp"

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>

namespace symmpool::torch_ext {

std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_then_matmul(Communicator& comm, WorkspaceUse& use,
                                                                       const at::Tensor& x, at::TensorList Bs,
                                                                       HostSteps& steps) {
  const int world = comm.world(), rank = comm.rank();
  const std::int64_t m = x.size(0), k = x.size(1);
  const std::size_t shard_bytes = bytes_of(x);
  const at::Tensor mine = staging(use.buffer(), {m, k}, x.scalar_type());
  at::Tensor gathered = at::empty({world * m, k}, x.options());
  std::vector<at::Tensor> outs;
  outs.reserve(Bs.size());
  for (const at::Tensor& B : Bs) outs.push_back(at::empty({world * m, B.size(1)}, x.options()));
  steps.mark("setup");

  // Our shard where the peers read it; then, once every rank's is there,
  // every shard (ours from x) into its rows of A at once.
  copy_bytes(mine.data_ptr(), x.data_ptr(), shard_bytes, use.main());
  steps.mark("stage");
  meet(comm, use.main());
  steps.mark("meet");
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  for (int r = 0; r < world; ++r) {
    dsts.push_back(gathered.narrow(0, r * m, m).data_ptr());
    srcs.push_back(r == rank ? x.data_ptr() : call_translating_errors([&] {
      return comm.peer_address(mine.data_ptr(), shard_bytes, r);
    }));
  }
  copy_all(dsts, srcs, shard_bytes, use.main(), use.capturing());
  steps.mark("gather");
  for (std::size_t i = 0; i < Bs.size(); ++i) mm_into(outs[i], gathered, Bs[i]);
  steps.mark("matmuls");
  // Nobody reads our workspace any more.
  meet(comm, use.main());
  steps.mark("meet");
  use.finish();
  steps.mark("finish");
  return {gathered, outs};
}

at::Tensor produce_then_all_to_all(Communicator& comm, WorkspaceUse& use, const at::Tensor& A,
                                   const at::Tensor& B, const std::string& how) {
  HostSteps steps("produce_and_all_to_all");
  const int world = comm.world(), rank = comm.rank();
  const std::int64_t rows = A.size(0) / world, cols = B.size(1);
  const at::Tensor stacked = staging(use.buffer(), {world, rows, cols}, A.scalar_type());
  const std::size_t chunk_bytes = static_cast<std::size_t>(rows * cols) * A.element_size();
  steps.mark("setup");
  const at::Tensor product = at::mm(A, B);  // chunk d: rows d
  steps.mark("matmul");
  // Every peer is done with its workspace's last use: pushes may write into it.
  meet(comm, use.main());
  steps.mark("meet");
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  void* my_slot = stacked[rank].data_ptr();
  for (int d = 0; d < world; ++d) {
    dsts.push_back(d == rank ? my_slot : call_translating_errors([&] {
      return comm.peer_address(my_slot, chunk_bytes, d);
    }));
    srcs.push_back(product.narrow(0, d * rows, rows).data_ptr());
  }
  copy_all(dsts, srcs, chunk_bytes, use.main(), use.capturing());
  steps.mark("push");
  // Every push has landed, everywhere.
  meet(comm, use.main());
  steps.mark("meet");
  at::Tensor out = combine(stacked, how);
  steps.mark("combine");
  use.finish();
  steps.mark("finish");
  return out;
}

}  // namespace symmpool::torch_ext
