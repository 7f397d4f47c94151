# Sourced by every script that may start GPU programs: NVLink multicast stays
# off on the shared test hosts (DESIGN.md), in this shell and its children.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export SYMMPOOL_DISABLE_MULTICAST=1
