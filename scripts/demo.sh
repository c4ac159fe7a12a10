#!/usr/bin/env bash
# make demo: the simulated training on the embedded default config
# (simulated GPU, swap files in a temp dir that is removed afterwards),
# with a progress line per step and a closing summary that includes the
# bit-for-bit comparison with in-memory training.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-}
if [ -z "$dir" ]; then
  dir=$(mktemp -d "${TMPDIR:-/var/tmp}/zinf-demo.XXXXXX")
  trap 'rm -rf "$dir"' EXIT
fi
echo "== zinf demo: simulated training with parameters and optimizer states on NVMe (swap dir $dir)"
./bin/zinf train --dir "$dir" --layers 8 --width 512 --steps 6 --verify --compute-ms-per-layer 10
echo
echo "== zinf io: a 256 MiB write and read round trip through the engine on the same dir"
./bin/zinf io --path "$dir" --size 256MiB --op write --loops 3 --keep --file demo-io.dat 2>/dev/null
./bin/zinf io --path "$dir" --size 256MiB --op read --loops 3 --file demo-io.dat 2>/dev/null
rm -f "$dir/demo-io.dat"
