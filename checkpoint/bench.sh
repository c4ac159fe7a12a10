#!/usr/bin/env bash
# Checkpoint speed, for BENCHMARKS.md: a 4 GiB checkpoint saved by zinf
# against fio's sequential O_DIRECT write of the same shape on the same
# directory (same block size, same queue depth per file, same number of
# files, fresh files, --end_fsync=1), the naive Go writer, and the time an
# asynchronous save holds the caller, interleaved round by round; medians
# and ratios. Then the same with the tensors in a swap store (zinf's NVMe
# tier), where SaveAsync pins versions instead of copying.
#
#   checkpoint/bench.sh [DIR]     (BENCH_SIZE=4GiB BENCH_ROUNDS=5)
#
# DIR must be on the disk to measure (default: a fresh directory under
# /var/tmp); it needs about 2x BENCH_SIZE free, and the machine about
# 3x BENCH_SIZE of RAM (the async snapshot, the naive writer's tensors).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v fio >/dev/null 2>&1 || { echo "fio not found (apt-get install -y fio)" >&2; exit 1; }
dir=${1:-$(mktemp -d /var/tmp/zinf-ckpt-bench.XXXXXX)}
bin=$(mktemp -d)/zinf
trap 'rm -rf "$(dirname "$bin")"; [ -z "${1:-}" ] && rm -rf "$dir"' EXIT
go build -o "$bin" ./cmd/zinf
size=${BENCH_SIZE:-4GiB}
rounds=${BENCH_ROUNDS:-5}
echo "machine: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM, $(uname -r), $(fio --version), $(go version | cut -d' ' -f3)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "\$ zinf ckpt bench --path $dir --size $size --rounds $rounds"
"$bin" ckpt bench --path "$dir" --size "$size" --rounds "$rounds"
echo
echo "\$ zinf ckpt bench --path $dir --size $size --rounds 3 --source store --no-naive"
"$bin" ckpt bench --path "$dir" --size "$size" --rounds 3 --source store --no-naive
