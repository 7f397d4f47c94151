#include "tp/fused_one_shot.hpp"

#include "c10d/collective_router.hpp"
#include "torch_errors.hpp"

#include <symmpool/algorithm_table.hpp>

#include <cstddef>
#include <cstdint>

namespace symmpool::torch_ext {

bool reduce_scatter_in_one_shot(std::int64_t split, std::int64_t product_bytes, at::ScalarType dtype,
                                const std::string& how) {
  return split == 0 && product_bytes <= one_shot_bytes() && (how == "sum" || how == "avg") &&
         symmpool_type(dtype).has_value();
}

std::tuple<at::Tensor, std::vector<at::Tensor>> all_gather_then_matmul(Communicator& comm, WorkspaceUse& use,
                                                                       const at::Tensor& x, at::TensorList Bs,
                                                                       HostSteps& steps) {
  const int world = comm.world();
  const std::int64_t m = x.size(0), k = x.size(1);
  const std::size_t shard_bytes = bytes_of(x);
  const at::Tensor mine = staging(use.buffer(), {m, k}, x.scalar_type());
  at::Tensor gathered = at::empty({world * m, k}, x.options());
  std::vector<at::Tensor> outs;
  outs.reserve(Bs.size());
  for (const at::Tensor& B : Bs) outs.push_back(at::empty({world * m, B.size(1)}, x.options()));
  steps.mark("setup");

  // The group's all-gather, our shard staged where the peers read it within
  // the call (the peers read into `gathered`, which is not symmetric: a
  // pull where the table would push).
  Algorithm algorithm = choose_algorithm(CollectiveKind::kAllGather, shard_bytes * world, world);
  if (algorithm == Algorithm::kCopyEnginePush) algorithm = Algorithm::kCopyEnginePull;
  call_translating_errors([&] {
    comm.all_gather_staged(x.data_ptr(), mine.data_ptr(), gathered.data_ptr(), shard_bytes,
                           use.main().stream(), algorithm, BarrierKind::kStreamOps);
    return 0;
  });
  steps.mark("gather");
  for (std::size_t i = 0; i < Bs.size(); ++i) mm_into(outs[i], gathered, Bs[i]);
  steps.mark("matmuls");
  use.finish();
  steps.mark("finish");
  return {gathered, outs};
}

at::Tensor matmul_then_reduce_scatter(Communicator& comm, WorkspaceUse& use, const at::Tensor& A,
                                      const at::Tensor& B, const std::string& how) {
  HostSteps steps("matmul_reduce_scatter");
  const int world = comm.world();
  const std::int64_t rows = A.size(0) / world, cols = B.size(1);
  // The product where the peers read their rows of it: the previous fused
  // call left the workspace free on every rank (its last meeting).
  const at::Tensor product = staging(use.buffer(), {A.size(0), cols}, A.scalar_type());
  at::Tensor out = at::empty({rows, cols}, A.options());
  steps.mark("setup");
  mm_into(product, A, B);
  steps.mark("matmul");
  call_translating_errors([&] {
    comm.reduce_scatter(product.data_ptr(), out.data_ptr(), static_cast<std::size_t>(rows * cols),
                        *symmpool_type(A.scalar_type()), how == "avg" ? ReduceOp::kAvg : ReduceOp::kSum,
                        use.main().stream());
    return 0;
  });
  steps.mark("reduce-scatter");
  use.finish();
  steps.mark("finish");
  return out;
}

}  // namespace symmpool::torch_ext
