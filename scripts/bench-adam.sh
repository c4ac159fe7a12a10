#!/usr/bin/env bash
# make bench-adam: the optimizer's update rule on every kernel of this CPU
# (BenchmarkAdam in swapper/optimizer), in ROUNDS interleaved rounds (each
# round runs every variant once), then the median and min..max of each
# variant's Gelem/s, and how busy the machine was during each round (CPU
# time of everything else, from /proc/stat minus the benchmark's own).
# BENCH re-selects variants (a -bench pattern); HUGEPAGES=1 maps the
# operands on transparent huge pages. Needs about 1.2 GiB of memory.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-6}
pattern=${BENCH:-Adam}
out=$(mktemp -d "${TMPDIR:-/tmp}/zinf-bench-adam.XXXXXX")
trap 'rm -rf "$out"' EXIT
go test -c -o "$out/optimizer.test" ./swapper/optimizer/
echo "machine: $(nproc) CPUs, $(uname -r), $(go version | cut -d' ' -f3), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), rounds: $rounds, bench: $pattern, huge pages: ${HUGEPAGES:-0}"
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
ticks=$(getconf CLK_TCK)
for r in $(seq 1 "$rounds"); do
  read -r b0 t0 < <(busy)
  ZINF_BENCH_HUGEPAGES=${HUGEPAGES:-0} /usr/bin/time -f "%U %S" -o "$out/time.$r" \
    "$out/optimizer.test" -test.run NONE -test.bench "$pattern" -test.benchmem >"$out/round.$r"
  read -r b1 t1 < <(busy)
  read -r u s <"$out/time.$r"
  awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) -v u="$u" -v s="$s" -v hz="$ticks" -v r="$r" -v cpus="$(nproc)" 'BEGIN {
    own = (u + s) * hz; other = b - own; if (other < 0) other = 0
    printf "round %d: machine %.0f%% busy, %.2f of %d CPUs used by others\n", r, 100 * b / t, cpus * other / t, cpus }'
done
cat "$out"/round.* | awk '
  /^BenchmarkAdam/ {
    name = $1; sub(/-[0-9]+$/, "", name)
    if (!(name in seen)) { seen[name] = 1; order[++n] = name }
    for (i = 2; i <= NF; i++) {
      if ($(i) == "Gelem/s") wall[name] = wall[name] " " $(i-1)
      if ($(i) == "Gelem/cpu-s") cpu[name] = cpu[name] " " $(i-1)
    }
  }
  function stat(list,    a, m, i, j, x, med) {
    m = split(substr(list, 2), a, " ")
    if (m == 0) return "-"
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] + 0 < a[i] + 0) { x = a[i]; a[i] = a[j]; a[j] = x }
    med = (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    return sprintf("%.3f (%.3f..%.3f)", med, a[1], a[m])
  }
  END {
    printf "%-52s %-24s %-24s\n", "variant", "Gelem/s median (min..max)", "Gelem/cpu-s median (min..max)"
    for (k = 1; k <= n; k++) printf "%-52s %-24s %-24s\n", substr(order[k], 15), stat(wall[order[k]]), stat(cpu[order[k]])
  }'
