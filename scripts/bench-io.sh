#!/usr/bin/env bash
# make bench-io: zinf io against fio on the same 1 GiB file, interleaved.
# Installs fio (Debian) when missing. BENCH_DIR picks the directory
# (default: a fresh directory under $TMPDIR or /var/tmp, on the disk).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v fio >/dev/null 2>&1; then
  echo "fio not found: installing it (apt-get install -y fio)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq fio >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq fio >/dev/null; fi
fi
dir=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/zinf-bench.XXXXXX")}
trap 'rm -rf "$dir"' EXIT
echo "machine: $(nproc) CPUs, $(uname -r), $(fio --version), $(go version | cut -d' ' -f3)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
./bin/zinf bench-io --path "$dir" --size "${BENCH_SIZE:-1GiB}" --block-size 1MiB --queue-depth 32 --rounds "${BENCH_ROUNDS:-5}"
