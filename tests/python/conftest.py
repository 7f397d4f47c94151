import os

# NVLink multicast stays off in every test process and its children: on the
# shared test hosts it can take the GPUs out of service (DESIGN.md).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
os.environ["SYMMPOOL_DISABLE_MULTICAST"] = "1"

# Tests run the benchmarks on whatever tree is checked out, into scratch files:
# the refusal of a dirty tree (bench/provenance.py) is for results files.
# test_provenance.py clears it to test the refusal itself.
os.environ.setdefault("SYMMPOOL_BENCH_ALLOW_DIRTY", "1")
