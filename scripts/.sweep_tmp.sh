source scripts/env.sh
(cmake -S . -B build-core -G Ninja -DCMAKE_BUILD_TYPE=Release -DSYMMPOOL_BUILD_TORCH=OFF && cmake --build build-core -j16) > /tmp/build.log 2>&1 || { tail /tmp/build.log; exit 1; }
SYMMPOOL_COPY_STREAMS=3 timeout 150 build-core/tests/multigpu/symmpool_collectives_tests --gtest_filter='*MatchNccl*' > $OUT/coll_streams3.log 2>&1; echo "streams3 tests rc $?"; grep -E "failures|PASSED|FAILED" $OUT/coll_streams3.log
mkdir -p /tmp/sw
for n in 1 2 3 4; do
  SYMMPOOL_COPY_STREAMS=$n timeout 90 build-core/bench/symmpool_collectives_bench --benchmark_filter='^(AllGather/(nccl|symmpool-ce-pull|symmpool-ce-push)/(16MiB|64MiB|256MiB|1GiB)|ReduceScatter/symmpool-2step/(64MiB|256MiB|1GiB)|Contention/(nccl|symmpool)/AllGather)' --benchmark_out=/tmp/sw/streams_$n.json --benchmark_out_format=json > /tmp/sw/streams_$n.log 2>&1
  echo "streams $n rc $?"; grep -E "1GiB|256MiB|Contention" /tmp/sw/streams_$n.log | sed 's/iterations:[0-9]*\/manual_time//' | cut -c1-150
done
tar czf $OUT/streams.tgz -C /tmp/sw .
