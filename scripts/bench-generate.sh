#!/bin/sh
# make bench-generate: decoding tokens/s of the zoo transformer with its
# weights on NVMe (contrib/gomlx/cmd/zinf-generate), by batch and pinned
# pool, in interleaved rounds, against the plan's prediction
# (zinf.PlanGeneration: max(weight reads at the measured bandwidth,
# measured compute)). Prints one line per run and the medians.
#   BENCH_GEN_MODEL  the model (default vocab=256,dim=512,layers=4,heads=8,kv-heads=4,ffn=2048: 45 MiB fp32)
#   BENCH_GEN_POOLS  pinned pools (default "16MiB 40MiB": about one layer, and room to prefetch)
#   BENCH_GEN_BATCHES (default "1 2 4 8"), BENCH_GEN_ROUNDS (default 3), BENCH_GEN_NEW (default 8)
#   BENCH_GEN_DIR    swap directory (default $TMPDIR or /var/tmp)
#   BENCH_GEN_FLAGS  more zinf-generate flags for every run (e.g. --config FILE, --piece-bytes -1)
set -eu
bin=${ZINF_GENERATE:-bin/zinf-generate}
model=${BENCH_GEN_MODEL:-vocab=256,dim=512,layers=4,heads=8,kv-heads=4,ffn=2048}
pools=${BENCH_GEN_POOLS:-16MiB 40MiB}
batches=${BENCH_GEN_BATCHES:-1 2 4 8}
rounds=${BENCH_GEN_ROUNDS:-3}
new=${BENCH_GEN_NEW:-8}
dir=${BENCH_GEN_DIR:-${TMPDIR:-/var/tmp}}
extra=${BENCH_GEN_FLAGS:-}
work=$(mktemp -d "$dir/zinf-bench-generate.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
i=0
while [ $i -lt 16 ]; do
	printf 'And God said, %02d\n' $i >>"$work/prompts.txt" # prompts of one length
	i=$((i + 1))
done
echo "model $model; $rounds rounds, $new new tokens; swap files in $dir; flags: ${extra:-none}; load average $(cut -d' ' -f1-3 /proc/loadavg)"
# Per run: measured tokens/s at the median full decoding step; (a) the
# NVMe-bound prediction, batch / (weight bytes per decoding step / the
# measured read bandwidth) = batch / the plan's weight I/O time, and
# measured / that; (c) the median step over max(compute, weight + KV I/O),
# compute as the plan measured it (batch 1 and 4, time less the waits).
r=1
while [ $r -le "$rounds" ]; do
	for pool in $pools; do
		for b in $batches; do
			head -n "$b" "$work/prompts.txt" >"$work/p.txt"
			# shellcheck disable=SC2086 # $extra is a list of flags
			out=$("$bin" --model "$model" --pool "$pool" --batch "$b" --max-new-tokens "$new" --progress=false \
				--prompts-file "$work/p.txt" --dir "$dir" $extra 2>&1) || { echo "$out"; exit 1; }
			echo "$out" | awk -v r="$r" -v pool="$pool" -v b="$b" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
				function ms(x) {
					sub(/[),:]+$/, "", x)
					if (x ~ /ms$/) { sub(/ms$/, "", x); return x + 0 }
					if (x ~ /µs$/) { sub(/µs$/, "", x); return x / 1000 }
					if (x ~ /ns$/) { sub(/ns$/, "", x); return x / 1e6 }
					sub(/s$/, "", x); return x * 1000
				}
				/^plan: / {
					n = 0
					for (i = 1; i <= NF; i++) {
						if ($i == "predicted") pred = $(i+1)
						if ($i == "I/O") { n++; if (n == 1) io = ms($(i+1)); else kv = ms($(i+1)) }
						if ($i == "compute") comp = ms($(i+1))
					}
				}
				/^generated /  { for (i = 1; i <= NF; i++) { if ($i == "passes,") passes = $(i-1); if ($i == "io-wait") { w = $(i+1) } } }
				/^tokens\/s: / { tps = $2; for (i = 1; i <= NF; i++) if ($i == "step") { st = $(i+1); sub(/^\(/, "", st) } }
				END {
					bound = io + kv; if (comp > bound) bound = comp
					nvme = b * 1000 / io
					printf "round %d pool %-6s batch %2d: %7.2f tokens/s step %7.1f ms | NVMe-bound %7.2f a= %.2f | io %6.1f compute %6.1f ms c= %.2f | plan %7.2f tokens/s, io-wait %.1f ms/pass, load %s\n", r, pool, b, tps, st, nvme, tps / nvme, io + kv, comp, st / bound, pred, w / passes, load
				}'
		done
	done
	r=$((r + 1))
done | tee "$work/runs.txt"
echo "medians (min..max) over $rounds rounds; load average now $(cut -d' ' -f1-3 /proc/loadavg):"
for pool in $pools; do
	for b in $batches; do
		grep " pool $pool *batch *$b:" "$work/runs.txt" | awk '
			function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t } return a[int((n + 1) / 2)] }
			{ for (i = 1; i <= NF; i++) { if ($i == "tokens/s") t[NR] = $(i-1); if ($i == "a=") a[NR] = $(i+1); if ($i == "c=") c[NR] = $(i+1); if ($i == "NVMe-bound") nb[NR] = $(i+1); if ($i == "io") io[NR] = $(i+1); if ($i == "compute") cp[NR] = $(i+1) } }
			END {
				n = NR
				tm = med(t, n); lo = t[1]; hi = t[n]; am = med(a, n); alo = a[1]; ahi = a[n]; cm = med(c, n); clo = c[1]; chi = c[n]
				printf "  pool %-6s batch %2d: %7.2f tokens/s (%.2f..%.2f); (a) measured / NVMe-bound %.2f (%.2f..%.2f), NVMe-bound %.2f; (c) step / max(compute, I/O) %.2f (%.2f..%.2f), I/O %.1f ms, compute %.1f ms\n", pool_, b_, tm, lo, hi, am, alo, ahi, med(nb, n), cm, clo, chi, med(io, n), med(cp, n)
			}' pool_="$pool" b_="$b"
	done
done
