#pragma once
// Adds the run's provenance to Google Benchmark's JSON context (it already
// records the date and host): the commit and whether the tree was clean,
// device, GPU count, driver, CUDA, NCCL and torch versions. As
// bench/provenance.py does for the Python benchmarks (docs/results.md).

namespace symmpool::bench {

// Exits with status 2 and a message on stderr when the tree's tracked files
// differ from its commit, or no commit is known, unless
// SYMMPOOL_BENCH_ALLOW_DIRTY=1. The commit is $SYMMPOOL_COMMIT where set
// (a copy whose .git is stale: the lent GPU machines; "<commit>-dirty" for a
// tree with changes), else git's HEAD of the source directory. Call it before
// any CUDA call (it runs git) and before forking ranks (they reuse its answer).
void require_clean_tree(const char* program);

// Returns false (and adds "gpu": "none", "gpu_count": "0") when no GPU is
// visible; adds "commit", "commit_source" and "clean_tree" either way.
bool add_gpu_context();

// BENCHMARK_MAIN's body with the two above: for benches with nothing else to set up.
int run_benchmarks(int argc, char** argv, const char* program);

}  // namespace symmpool::bench
