#include "process_group.hpp"

#include <symmpool/store.hpp>

#include <cuda_runtime_api.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace symmpool::test {

bool ranks_share_gpu() {
  const char* v = std::getenv("SYMMPOOL_TEST_RANKS_SHARE_GPU");
  return v && (std::strcmp(v, "1") == 0 || std::strcmp(v, "true") == 0 || std::strcmp(v, "yes") == 0 ||
               std::strcmp(v, "on") == 0);
}

int device_of_rank(int rank) { return ranks_share_gpu() ? 0 : rank; }

std::string shared_store_dir() {
  // Removed when this process exits; the ranks leave with _exit, so only the
  // parent that made it removes it, after they are gone.
  static const TempStoreDir dir;
  return dir.path();
}

int count_gpus_in_child() {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
    _exit(n > 100 ? 100 : n);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

std::string run_ranks(int world, int timeout_seconds, const std::function<int(int, int, Rendezvous&)>& body) {
  void* shared = mmap(nullptr, sizeof(Rendezvous), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return "mmap of the rendezvous page failed";
  auto* rv = new (shared) Rendezvous{};
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = body(r, world, *rv);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] exception: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::string failures;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  std::vector<bool> done(static_cast<std::size_t>(world), false);
  int remaining = world;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[static_cast<std::size_t>(r)]) continue;
      int status = 0;
      if (waitpid(pids[static_cast<std::size_t>(r)], &status, WNOHANG) == 0) continue;
      done[static_cast<std::size_t>(r)] = true;
      --remaining;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        failures += "rank " + std::to_string(r) + " failed (status " + std::to_string(status) + "); ";
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (done[static_cast<std::size_t>(r)]) continue;
        kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
        failures += "rank " + std::to_string(r) + " hung past " + std::to_string(timeout_seconds) +
                    " s and was killed; ";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  munmap(shared, sizeof(Rendezvous));
  return failures;
}

}  // namespace symmpool::test
