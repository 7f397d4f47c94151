#include "bench_context.hpp"

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#ifndef SYMMPOOL_SOURCE_DIR
#error "bench/CMakeLists.txt defines SYMMPOOL_SOURCE_DIR: the checkout whose commit is recorded"
#endif

namespace symmpool::bench {

namespace {
std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04 ..." -> the line.
std::string kernel_driver() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  return std::getline(f, line) ? line : "unknown";
}

std::string trimmed(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r\n"), end = s.find_last_not_of(" \t\r\n");
  return begin == std::string::npos ? "" : s.substr(begin, end - begin + 1);
}

// `command`'s standard output; false if it could not run or exited non-zero.
bool output_of(const std::string& command, std::string& out) {
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  out.clear();
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  return pclose(pipe) == 0;
}

struct Tree {
  std::string commit = "unknown";
  std::string commit_source = "none";
  std::string clean_tree = "unknown";  // "true", "false", or "unknown" (no commit known)
  std::string modified;                // git's list of modified tracked files
};

// Asked once per process: forked ranks inherit the parent's answer.
const Tree& tree() {
  static const Tree t = [] {
    Tree found;
    const char* told = std::getenv("SYMMPOOL_COMMIT");
    if (told != nullptr && !trimmed(told).empty()) {
      const std::string commit = trimmed(told), dirty = "-dirty";
      const bool is_dirty = commit.size() > dirty.size() &&
                            commit.compare(commit.size() - dirty.size(), dirty.size(), dirty) == 0;
      found.commit = is_dirty ? commit.substr(0, commit.size() - dirty.size()) : commit;
      found.commit_source = "SYMMPOOL_COMMIT";
      found.clean_tree = is_dirty ? "false" : "true";
      return found;
    }
    const std::string git = std::string("git -C '") + SYMMPOOL_SOURCE_DIR + "' ";
    std::string head, status;
    if (output_of(git + "rev-parse HEAD 2>/dev/null", head) &&
        output_of(git + "status --porcelain --untracked-files=no 2>/dev/null", status)) {
      found.commit = trimmed(head);
      found.commit_source = "git";
      found.clean_tree = status.empty() ? "true" : "false";
      found.modified = status;
    }
    return found;
  }();
  return t;
}

void add_tree_context() {
  benchmark::AddCustomContext("commit", tree().commit);
  benchmark::AddCustomContext("commit_source", tree().commit_source);
  benchmark::AddCustomContext("clean_tree", tree().clean_tree);
}

}  // namespace

void require_clean_tree(const char* program) {
  const Tree& t = tree();
  const char* allow = std::getenv("SYMMPOOL_BENCH_ALLOW_DIRTY");
  if (t.clean_tree == "true" || (allow != nullptr && std::string(allow) == "1")) return;
  std::string why;
  if (t.commit_source == "none")
    why = std::string(SYMMPOOL_SOURCE_DIR) + " is not a git checkout and SYMMPOOL_COMMIT is unset";
  else if (t.commit_source == "SYMMPOOL_COMMIT")
    why = "SYMMPOOL_COMMIT=" + trimmed(std::getenv("SYMMPOOL_COMMIT")) + " says the tree had changes";
  else {
    why = "tracked files differ from " + t.commit.substr(0, 12) + ":";
    std::size_t shown = 0, begin = 0;
    for (std::size_t end; (end = t.modified.find('\n', begin)) != std::string::npos; begin = end + 1, ++shown)
      if (shown < 8) why += "\n" + t.modified.substr(begin, end - begin);
    if (shown > 8) why += "\n and " + std::to_string(shown - 8) + " more";
  }
  std::fprintf(
      stderr,
      "%s: refusing to benchmark a dirty tree (%s)\nCommit first (on a copy whose .git is stale, set "
      "SYMMPOOL_COMMIT to the commit its files are), or set SYMMPOOL_BENCH_ALLOW_DIRTY=1 to measure it "
      "anyway: the results then say clean_tree: false.\n",
      program, trimmed(why).c_str());
  std::exit(2);
}

bool add_gpu_context() {
  add_tree_context();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    benchmark::AddCustomContext("gpu", "none");
    benchmark::AddCustomContext("gpu_count", "0");
    return false;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  int driver = 0, runtime = 0, nccl = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  benchmark::AddCustomContext("gpu", prop.name);
  benchmark::AddCustomContext("gpu_count", std::to_string(count));
  benchmark::AddCustomContext("nvidia_driver", kernel_driver());
  benchmark::AddCustomContext("cuda_driver", version_string(driver));
  benchmark::AddCustomContext("cuda_runtime", version_string(runtime));
  benchmark::AddCustomContext("nccl", std::to_string(nccl / 10000) + "." +
                                          std::to_string((nccl / 100) % 100) + "." +
                                          std::to_string(nccl % 100));
#ifdef SYMMPOOL_TORCH_VERSION
  benchmark::AddCustomContext("torch", SYMMPOOL_TORCH_VERSION);
#else
  benchmark::AddCustomContext("torch", "not built");
#endif
  return true;
}

int run_benchmarks(int argc, char** argv, const char* program) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  require_clean_tree(program);
  add_gpu_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace symmpool::bench
