#!/usr/bin/env bash
# The unit tests (fake driver, no GPU) under a sanitizer; any report fails
# the run. scripts/sanitize.sh [address|thread]:
#   address (default): AddressSanitizer (leaks included) and UBSan, build-sanitize/
#   thread: ThreadSanitizer, build-tsan/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
mode=${1:-address}
case "$mode" in
  address)
    dir=build-sanitize
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
    ;;
  thread)
    dir=build-tsan
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
    ;;
  *)
    echo "usage: $0 [address|thread]" >&2
    exit 2
    ;;
esac
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSYMMPOOL_BUILD_TORCH=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags"
cmake --build "$dir" -j "$(nproc)" --target symmpool_unit_tests  # one executable per layer
for layer in common allocator symmetric collectives; do
  "$dir/tests/unit/symmpool_${layer}_unit_tests"
done
