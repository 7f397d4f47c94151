"""Where an eager all-reduce's host time goes, layer by layer: the same
1 KiB call from C++ loops (the "symm" backend's allreduce; ProcessGroup::
allreduce, through torch's dispatcher; an add_ through the dispatcher, the
floor of any eager op) and from Python (the backend's binding, dist).
Every rank on GPU 0 (host times only: the host side of a 2-rank call does
not depend on where the peer's GPU is), so it runs on one-GPU machines:

    torchrun --standalone --nproc-per-node=2 bench/host_layers.py --out <json>

The C++ loops are compiled at start (torch.utils.cpp_extension.load_inline,
about a minute). Cases rotate within each repetition; per case the median,
p10 and p90 over repetitions of the slowest rank's time per call. Refuses a
tree whose tracked files differ from its commit unless --allow-dirty
(bench/provenance.py).
"""

from __future__ import annotations

import os

# NVLink multicast stays off on the lent machines, set before torch reads it.
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
                  SYMMPOOL_DISABLE_MULTICAST="1", SYMMPOOL_COLLECTIVES="always", SYMMPOOL_TEST_RANKS_SHARE_GPU="1")

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import AllreduceOptions  # noqa: E402
from torch.utils.cpp_extension import load_inline  # noqa: E402

import provenance  # noqa: E402  (bench/, this script's folder)
import symmpool  # noqa: E402,F401  (registers the "symm" backend)
from host_time import meet, per_call_us, report, sample_rotating  # noqa: E402  (bench/, this script's folder)

# Each loop returns microseconds per call.
LOOPS = r"""
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>

template <typename Call>
double per_call_us(int n, Call call) {
  const auto began = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) call();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - began).count() / n;
}

double backend_allreduce(const c10::intrusive_ptr<c10d::Backend>& backend, at::Tensor t, int n, bool wait) {
  std::vector<at::Tensor> tensors{t};
  return per_call_us(n, [&] {
    auto work = backend->allreduce(tensors, c10d::AllreduceOptions());
    if (wait) work->wait();
  });
}

double group_allreduce(const c10::intrusive_ptr<c10d::ProcessGroup>& group, at::Tensor t, int n) {
  std::vector<at::Tensor> tensors{t};
  return per_call_us(n, [&] { group->allreduce(tensors, c10d::AllreduceOptions())->wait(); });
}

double add(at::Tensor t, int n) {
  return per_call_us(n, [&] { t.add_(0); });
}
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=200, help="calls per sample")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", help="JSON written by rank 0")
    provenance.add_allow_dirty(p)
    args = p.parse_args()
    tree = provenance.require_clean_tree(args.allow_dirty)
    loops = load_inline("symmpool_host_layers", cpp_sources=[LOOPS],
                        functions=["backend_allreduce", "group_allreduce", "add"], extra_cflags=["-O2"])

    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    dist.init_process_group("cpu:gloo,cuda:symm")  # no bound device: NCCL refuses ranks sharing a GPU
    group = dist.group.WORLD
    backend = group._get_backend(device)
    t = backend.allocate_tensor(512, dtype=torch.bfloat16, device=device).normal_()
    n = args.calls
    cases = {
        "C++ add_ (dispatcher floor)": lambda: loops.add(t, n),
        "C++ backend->allreduce": lambda: loops.backend_allreduce(backend, t, n, False),
        "C++ backend->allreduce + wait": lambda: loops.backend_allreduce(backend, t, n, True),
        "C++ ProcessGroup::allreduce + wait (dispatcher)": lambda: loops.group_allreduce(group, t, n),
        "Python t.add_(0)": lambda: per_call_us(lambda: t.add_(0), n),
        "Python backend.allreduce": lambda: per_call_us(lambda: backend.allreduce([t], AllreduceOptions()), n),
        "Python backend.allreduce + wait": lambda: per_call_us(
            lambda: backend.allreduce([t], AllreduceOptions()).wait(), n),
        "Python dist.all_reduce": lambda: per_call_us(lambda: dist.all_reduce(t), n),
    }

    for run in cases.values():  # warm-up
        run()
    report(sample_rotating(cases, args.reps, meet), {
        "what": "host time per call of a 1 KiB bf16 all-reduce on a \"symm\" group, by layer",
        "calls_per_rep": n, "reps": args.reps}, args.out, tree)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
