#!/usr/bin/env bash
# Which lines of the shard format code a fuzz_shard corpus reaches: rebuilds fuzz_shard with
# src/shard/format.cpp and reader.cpp under clang source coverage (the rest of the library comes
# from the fuzz build), replays the corpus once (-runs=0) and prints llvm-cov's per-function
# report for those two files, ShardIndex::parse among them.
#
#   tests/fuzz/coverage.sh BUILD_FUZZ_DIR OUT_DIR CORPUS_DIR...
set -euo pipefail

build="$1"
out="$2"
shift 2
mkdir -p "$out"
clang++ -std=c++20 -O1 -g -Iinclude -Isrc -fprofile-instr-generate -fcoverage-mapping \
  -fsanitize=fuzzer,address,undefined tests/fuzz/fuzz_shard.cpp src/shard/format.cpp \
  src/shard/reader.cpp "$build/libzerowait_core.a" -lxxhash -lturbojpeg -ljpeg -luring -lzstd \
  -lpng -lz -o "$out/fuzz_shard_coverage"
rm -f "$out"/*.profraw
LLVM_PROFILE_FILE="$out/replay.profraw" "$out/fuzz_shard_coverage" -runs=0 -max_len=65536 "$@" \
  2>&1 | grep -E '^fuzz_shard: |INITED'
llvm-profdata-14 merge -sparse "$out/replay.profraw" -o "$out/replay.profdata"
llvm-cov-14 report -show-functions "$out/fuzz_shard_coverage" \
  -instr-profile="$out/replay.profdata" src/shard/format.cpp src/shard/reader.cpp
