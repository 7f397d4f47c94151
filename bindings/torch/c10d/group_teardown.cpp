#include "c10d/group_teardown.hpp"

#include <symmpool/log.hpp>

#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace symmpool::torch_ext {

namespace {

struct Hook {
  const char* what;
  std::function<void(std::uint64_t)> run;
};

struct Hooks {
  std::mutex mutex;
  std::vector<Hook> hooks;
};

Hooks& hooks() {
  static auto* h = new Hooks;  // never destroyed: groups may go during static destruction
  return *h;
}

}  // namespace

void on_group_teardown(const char* what, std::function<void(std::uint64_t group_serial)> hook) {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.hooks.push_back({what, std::move(hook)});
}

void run_group_teardown(std::uint64_t group_serial) noexcept {
  Hooks& h = hooks();
  std::lock_guard<std::mutex> lock(h.mutex);  // hooks register at load time, never from a hook
  for (const Hook& hook : h.hooks) {
    try {
      hook.run(group_serial);
    } catch (const std::exception& e) {
      SYMMPOOL_WARN(kColl, "%s at a group's teardown failed: %s", hook.what, e.what());
    }
  }
}

}  // namespace symmpool::torch_ext
