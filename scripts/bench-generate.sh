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
set -eu
bin=${ZINF_GENERATE:-bin/zinf-generate}
model=${BENCH_GEN_MODEL:-vocab=256,dim=512,layers=4,heads=8,kv-heads=4,ffn=2048}
pools=${BENCH_GEN_POOLS:-16MiB 40MiB}
batches=${BENCH_GEN_BATCHES:-1 2 4 8}
rounds=${BENCH_GEN_ROUNDS:-3}
new=${BENCH_GEN_NEW:-8}
dir=${BENCH_GEN_DIR:-${TMPDIR:-/var/tmp}}
work=$(mktemp -d "$dir/zinf-bench-generate.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
i=0
while [ $i -lt 16 ]; do
	printf 'And God said, %02d\n' $i >>"$work/prompts.txt" # prompts of one length
	i=$((i + 1))
done
echo "model $model; $rounds rounds, $new new tokens; swap files in $dir"
r=1
while [ $r -le "$rounds" ]; do
	for pool in $pools; do
		for b in $batches; do
			head -n "$b" "$work/prompts.txt" >"$work/p.txt"
			out=$("$bin" --model "$model" --pool "$pool" --batch "$b" --max-new-tokens "$new" --progress=false \
				--prompts-file "$work/p.txt" --dir "$dir" 2>&1) || { echo "$out"; exit 1; }
			echo "$out" | awk -v r="$r" -v pool="$pool" -v b="$b" '
				/^plan: /      { for (i = 1; i <= NF; i++) if ($i == "predicted") pred = $(i+1) }
				/^generated /  { for (i = 1; i <= NF; i++) { if ($i == "passes,") passes = $(i-1); if ($i == "io-wait") { w = $(i+1) } } }
				/^tokens\/s: / { tps = $2; for (i = 1; i <= NF; i++) if ($i == "step") { ms = $(i+1); sub(/^\(/, "", ms) } }
				END { printf "round %d pool %-6s batch %2d: %7.2f tokens/s (median step %s ms), predicted %7.2f, io-wait %.1f ms per pass\n", r, pool, b, tps, ms, pred, w / passes }'
		done
	done
	r=$((r + 1))
done | tee "$work/runs.txt"
echo "medians:"
for pool in $pools; do
	for b in $batches; do
		grep " pool $pool *batch *$b:" "$work/runs.txt" | awk '{print $7, $14, $17}' | sort -n | awk -v pool="$pool" -v b="$b" '
			{ t[NR] = $1; p[NR] = $2; w[NR] = $3 }
			END { m = int((NR + 1) / 2); printf "  pool %-6s batch %2d: %7.2f tokens/s (min %.2f, max %.2f), predicted %.2f, measured / predicted %.2f\n", pool, b, t[m], t[1], t[NR], p[m], t[m] / p[m] }'
	done
done
