"""What works on any machine: the package, its backend and the C ABI's errors."""

import ctypes
import os
import re
import shutil
import subprocess

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import symmpool
from launch import gpu_count


def test_importing_registers_the_symm_backend():
    assert "SYMM" in dist.Backend._plugins
    assert dist.Backend._plugins["SYMM"].extended_api
    symmpool._backend.register_backend()  # idempotent


def test_python_sees_a_symm_backend_as_a_process_group_nccl():
    # torch's group splitting calls ProcessGroupNCCL methods on the default
    # group's backend, such as perform_nocolor_split on ranks outside a new group.
    assert issubclass(symmpool._C.SymmBackend, dist.ProcessGroupNCCL)
    assert hasattr(symmpool._C.SymmBackend, "perform_nocolor_split")


def test_library_exports_the_c_abi():
    lib = ctypes.CDLL(symmpool.library_path())
    for name in ("symmpool_malloc", "symmpool_free", "symmpool_empty_cache", "symmpool_last_error"):
        assert hasattr(lib, name), name


@pytest.mark.skipif(gpu_count() > 0, reason="checks the no-GPU error path")
def test_c_abi_reports_a_missing_gpu_instead_of_crashing():
    lib = ctypes.CDLL(symmpool.library_path())
    lib.symmpool_malloc.restype = ctypes.c_void_p
    lib.symmpool_last_error.restype = ctypes.c_char_p
    assert lib.symmpool_malloc(ctypes.c_size_t(1024), 0, None) is None
    assert b"CUDA" in lib.symmpool_last_error()


# Symbols that only libstdc++ defines. A library exporting one carries a
# private copy of libstdc++ whose locale facets do not match torch's: the
# first number it wrote to a stream crashed the process
# (cmake/SharedLibstdcxx.cmake).
LIBSTDCXX_OWN_SYMBOLS = ("_ZNSt6locale", "_ZNSo9_M_insert", "_ZNSt8ios_base", "_ZNKSt7codecvt", "_ZNSt7codecvt",
                         "_ZNKSt7num_put")


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm (binutils) to read the libraries' symbols")
def test_libraries_share_the_process_libstdcxx():
    for path in (symmpool.library_path(), symmpool._C.__file__):
        listing = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                                 check=True).stdout
        # Strong definitions only: a Debug build exports weak inline copies
        # (ios_base::setf, say) that are harmless.
        own = [fields[-1] for fields in map(str.split, listing.splitlines())
               if len(fields) >= 2 and fields[-2] not in ("W", "V", "w", "v")
               and fields[-1].startswith(LIBSTDCXX_OWN_SYMBOLS)]
        assert not own, f"{path} carries its own copy of libstdc++ ({len(own)} symbols, e.g. {own[:3]})"


def test_backend_rejects_foreign_options():
    with pytest.raises(TypeError, match="ProcessGroupNCCL.Options"):
        symmpool._backend._create_symm_backend(object(), backend_options=object())


def test_fsdp_helper_needs_fsdp_modules():
    with pytest.raises(ValueError, match="no FSDP2 module"):
        symmpool.allocate_fsdp_comm_buffers_from_symm(nn.Linear(2, 2))


def _library_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _torch_dirs_of_headers_named_in(library: bytes) -> set:
    """The torch directories of the headers whose paths a library's strings
    hold: what __FILE__ leaves in torch's inline checks, "<dir>/include/c10/...h"."""
    dirs = set()
    for m in re.finditer(rb"/include/(?:c10|ATen|torch)/", library):
        start = m.start()
        while start > 0 and 0x20 < library[start - 1] < 0x7f and library[start - 1] not in b"\"'":
            start -= 1
        dirs.add(os.path.realpath(library[start:m.start()].decode()))
    return dirs


def test_extension_built_against_this_torch():
    """What the built extension carries of the torch it compiled against, not
    the torch installed now: its version, its headers' directory, the C++ ABI
    of its std::string symbols and pybind11's internals id, each this torch's."""
    assert symmpool._C.BUILT_AGAINST_TORCH == torch.__version__, (
        f"built against torch {symmpool._C.BUILT_AGAINST_TORCH}, runs {torch.__version__}")
    extension = _library_bytes(symmpool._C.__file__)
    torch_dir = os.path.realpath(os.path.dirname(torch.__file__))
    built_against = _torch_dirs_of_headers_named_in(extension)
    assert built_against, f"{symmpool._C.__file__} names no torch header: what it was built against cannot be read"
    assert built_against == {torch_dir}, f"compiled against the torch headers of {built_against}, runs {torch_dir}"
    # std::__cxx11 names come only from the new C++ ABI (_GLIBCXX_USE_CXX11_ABI=1).
    assert (b"St7__cxx11" in extension) == bool(torch._C._GLIBCXX_USE_CXX11_ABI), "C++ ABI differs from torch's"
    # symmpool._C's classes derive from torch's (SymmBackend from ProcessGroupNCCL):
    # only with pybind11 internals of the same version and ABI.
    internals = rb"__pybind11_internals_v[\x21-\x7e]*"
    ours = set(re.findall(internals, extension))
    theirs = set(re.findall(internals, _library_bytes(os.path.join(torch_dir, "lib", "libtorch_python.so"))))
    assert len(ours) == 1 and ours <= theirs, f"pybind11 internals {ours}, torch's {theirs}"


def test_table_world_sizes_come_from_the_cpp_table():
    sizes = symmpool._C.table_world_sizes()
    assert sizes == sorted(set(sizes)) and 2 in sizes, sizes
    assert all(isinstance(w, int) and 2 <= w <= 8 for w in sizes), sizes


def test_algorithm_counts_name_every_algorithm_that_runs():
    counts = symmpool._C.algorithm_counts()
    assert sorted(counts) == sorted(["copy-engine pull", "copy-engine push", "kernel", "one-shot", "two-shot",
                                     "two-step", "low-latency"]), counts
    assert all(isinstance(n, int) and n >= 0 for n in counts.values()), counts


def test_routing_counts_name_every_reason():
    counts = symmpool._C.routing_counts()
    for reason in ("collectives disabled", "table prefers NCCL at this size", "buffer not in symmpool heap",
                   "group spans nodes", "SYMMPOOL_COLLECTIVES=always"):
        assert reason in counts, counts
    assert all(isinstance(n, int) and n >= 0 for n in counts.values()), counts
