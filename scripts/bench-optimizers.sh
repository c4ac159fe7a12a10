#!/usr/bin/env bash
# make bench-optimizers (and make bench-adam, BENCH=Adam): the optimizer's
# update rules on every kernel of this CPU (BenchmarkAdam and
# BenchmarkRules in swapper/optimizer: Adam; SGD plain, with momentum and
# Nesterov; Adagrad; Lion), in ROUNDS interleaved rounds (each round runs
# every variant once, SIMD and scalar in the same run), then per variant
# the median and min..max of its Gelem/s (wall clock) and Gelem/cpu-s
# (per CPU-second of the benchmark process), the SIMD/scalar ratios of the
# medians, and how busy the machine was during each round (CPU time of
# everything else, from /proc/stat minus the benchmark's own).
# BENCH re-selects variants (a -bench pattern, default 'Adam|Rules');
# HUGEPAGES=1 maps the operands on transparent huge pages. Needs about
# 1.2 GiB of memory.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-6}
pattern=${BENCH:-Adam|Rules}
out=$(mktemp -d "${TMPDIR:-/tmp}/zinf-bench-optimizers.XXXXXX")
trap 'rm -rf "$out"' EXIT
go test -c -o "$out/optimizer.test" ./swapper/optimizer/
echo "machine: $(nproc) CPUs, $(uname -r), $(go version | cut -d' ' -f3), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), rounds: $rounds, bench: $pattern, huge pages: ${HUGEPAGES:-0}, nice: $(nice)"
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
  /^Benchmark(Adam|Adam8|Rules)\// {
    name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
    if (!(name in seen)) { seen[name] = 1; order[++n] = name }
    for (i = 2; i <= NF; i++) {
      if ($(i) == "Gelem/s") wall[name] = wall[name] " " $(i-1)
      if ($(i) == "Gelem/cpu-s") cpu[name] = cpu[name] " " $(i-1)
      if ($(i) == "allocs/op") allocs[name] = $(i-1)
    }
  }
  function median(list,    a, m, i, j, x) {
    m = split(substr(list, 2), a, " ")
    if (m == 0) return -1
    for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] + 0 < a[i] + 0) { x = a[i]; a[i] = a[j]; a[j] = x }
    lo = a[1]; hi = a[m]
    return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
  }
  function stat(list,    med) {
    med = median(list)
    if (med < 0) return "-"
    return sprintf("%.3f (%.3f..%.3f)", med, lo, hi)
  }
  function ratio(list, name, kind,    s, a, b) {
    s = name; sub(/\/(avx2|avx512)\//, "/scalar/", s)
    if (s == name) return "1"
    a = median(list); b = median(kind == "cpu" ? cpu[s] : wall[s])
    if (a < 0 || b <= 0) return "-"
    return sprintf("%.1fx", a / b)
  }
  END {
    printf "%-44s %-26s %-26s %-9s %-9s %s\n", "variant", "Gelem/s median (min..max)", "Gelem/cpu-s median (min..max)", "x wall", "x cpu-s", "allocs/op"
    for (k = 1; k <= n; k++) {
      v = order[k]
      printf "%-44s %-26s %-26s %-9s %-9s %s\n", v, stat(wall[v]), stat(cpu[v]), ratio(wall[v], v, "wall"), ratio(cpu[v], v, "cpu"), allocs[v]
    }
    # BenchmarkAdam8: the 8-bit kernel against the fp32 kernel on the same
    # elements (the bar of the issue: >= 1.5x) and against the fp32 kernel in
    # the L2 cache (n=16Ki: the ceiling of any kernel running the body of Adam).
    for (k = 1; k <= n; k++) {
      v = order[k]
      if (v !~ /^Adam8\/.*\/adam8$/) continue
      f = v; sub(/\/adam8$/, "/adam32", f)
      c = f; sub(/^Adam8\/n=[0-9]+[KM]i\//, "Adam8/n=16Ki/", c)
      if (median(cpu[f]) > 0 && median(cpu[c]) > 0)
        printf "%s: %.2fx the Gelem/cpu-s of the fp32 kernel (%.2fx wall); the fp32 kernel out of cache runs at %.2fx its in-cache speed\n", v, median(cpu[v]) / median(cpu[f]), median(wall[v]) / median(wall[f]), median(cpu[f]) / median(cpu[c])
    }
  }'
