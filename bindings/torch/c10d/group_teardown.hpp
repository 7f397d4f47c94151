#pragma once
// What a group's teardown tells the layers built on top of it: the fused
// tensor-parallel ops let their workspaces go, say. They register here, so
// the c10d backend and a plain group's GroupSymmetry know nothing of them.

#include <cstdint>
#include <functional>

namespace symmpool::torch_ext {

// Runs `hook` with the serial of every group torn down from now on (kept
// for the process's life). `what` names it where it fails.
void on_group_teardown(const char* what, std::function<void(std::uint64_t group_serial)> hook);

// Tells every hook, after the group drained the device (nothing queued can
// still use what they free). A failing hook is said on stderr; the others
// still run.
void run_group_teardown(std::uint64_t group_serial) noexcept;

}  // namespace symmpool::torch_ext
