#!/bin/sh
# make bench-generate-big: issue 19's bar (b). A zoo transformer whose bf16
# weights exceed the machine's RAM, written with random weights from a seed
# (zinf-generate --make-model: streamed, a chunk at a time), then generated
# from side by side, each side in its own process, the file dropped from
# the page cache before each (--drop-cache: fdatasync + posix_fadvise
# DONTNEED of that file only):
#   zinf        every weight read in place from the file by O_DIRECT, layer
#               by layer through the pinned pool with prefetch (--in-place-only,
#               --piece-bytes -1: tensors move whole and are prefetched)
#   plain       the file mmap'ed and paged by the kernel (--mmap plain)
#   sequential  the same with MADV_SEQUENTIAL
#   willneed    MADV_SEQUENTIAL and MADV_WILLNEED one layer ahead
# Each prints its decoding steps (time, wait for weights), tokens/s, disk
# reads (/proc/self/io) and peak RSS (VmHWM; zinf's against pool + KV cache
# + 512 MiB); the script checks that every side generated the same greedy
# tokens. Runs for tens of minutes and needs the model's size free on disk:
# take the machine's big-run lock around it (flock /work/bigrun.lock make
# bench-generate-big). Not part of make test.
#   BIG_MODEL  default vocab=256,dim=2048,layers=168,heads=16,kv-heads=16,ffn=16384,dtype=bf16
#              (14.1e9 parameters, 26.25 GiB of bf16 weights, 160 MiB a layer)
#   BIG_SIDES  default "zinf plain"; BIG_ROUNDS default 1 (even rounds run the sides in reverse order)
#   BIG_NEW    new tokens, default 8;  BIG_BATCH default 1;  BIG_POOL default 512MiB (+ BIG_CACHE_MIB)
#   BIG_CACHE_MIB MiB of weights zinf keeps in its pinned pool for good (--max-in-cpu, spread over
#              the layers: read once, by no decoding step); default auto: the memory available less
#              7 GiB (the executors' buffers, the Go heap, the rest of the machine), in whole GiB
#              (15-16 GiB on the 23 GiB development VM; BENCHMARKS.md's runs set 16384); 0: every weight streamed every step. The pool
#              and the zinf side's address-space limit grow by as much.
#   BIG_NEW_MMAP new tokens of the mmap sides, default BIG_NEW (fewer shortens a run whose every
#              step rereads the file: their tokens are then checked as a prefix of zinf's)
#   BIG_COMPUTE the dtype the model computes in, default fp32 (each bf16 weight widened as its layer
#              is read, every side alike; the pure-Go backend's fp32 matmul is its fast one); bf16: as stored
#   BIG_MEMLIMIT GOMEMLIMIT of every side, default 600MiB (the Go heap kept near its live size:
#              the executors' buffers and the fp32 slots of a layer); empty: Go's default
#   BIG_DIR    the model file and swap files, default $TMPDIR or /var/tmp
#   BIG_TIMEOUT seconds a side may run, default 2400;  BIG_KEEP=1 keeps the model file
set -eu
bin=${ZINF_GENERATE:-bin/zinf-generate}
model=${BIG_MODEL:-vocab=256,dim=2048,layers=168,heads=16,kv-heads=16,ffn=16384,dtype=bf16}
sides=${BIG_SIDES:-zinf plain}
rounds=${BIG_ROUNDS:-1}
new=${BIG_NEW:-8}
new_mmap=${BIG_NEW_MMAP:-$new}
batch=${BIG_BATCH:-1}
cache_mib=${BIG_CACHE_MIB:-auto}
if [ "$cache_mib" = auto ]; then
	avail_mib=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
	cache_mib=$(((avail_mib - 7168) / 1024 * 1024))
	[ "$cache_mib" -gt 0 ] || cache_mib=0
fi
case $cache_mib in '' | *[!0-9]*)
	echo "BIG_CACHE_MIB: $cache_mib (allowed: auto, or a whole number of MiB, 0 for none)" >&2
	exit 2
	;;
esac
pool=${BIG_POOL:-$((512 + cache_mib))MiB}
memlimit=${BIG_MEMLIMIT-600MiB}
if [ -n "$memlimit" ]; then
	export GOMEMLIMIT="$memlimit"
fi
compute=${BIG_COMPUTE:-fp32} # the dtype the model computes in (the weights stay bf16): fp32, the backend's fast matmul
dir=${BIG_DIR:-${TMPDIR:-/var/tmp}}
limit=${BIG_TIMEOUT:-2400}
for s in $sides; do
	case $s in zinf | plain | sequential | willneed) ;; *)
		echo "BIG_SIDES: $s (allowed: zinf, plain, sequential, willneed)" >&2
		exit 2
		;;
	esac
done
work=$(mktemp -d "$dir/zinf-bench-big.XXXXXX")
if [ "${BIG_KEEP:-0}" = 1 ]; then
	trap 'rm -rf "$work/swap" "$work"/*.out' EXIT INT TERM
else
	trap 'rm -rf "$work"' EXIT INT TERM
fi
st=$work/model.safetensors
mkdir "$work/swap"
cat >"$work/config.json" <<EOF
{
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "$work/swap", "max_in_cpu": 0},
                        "offload_optimizer": {"device": "nvme", "nvme_path": "$work/swap"}},
  "zinf": {"device": "sim", "tiers": {"gpu_bytes": "8GiB", "cpu_pinned_bytes": "$pool"}, "checksums": false}
}
EOF
prompts=""
i=0
while [ $i -lt "$batch" ]; do
	prompts="$prompts --prompt $(echo ABCDEFGHIJKLMNOPQRSTUVWXYZ | cut -c$((i % 26 + 1)))" # one-token prompts: A, B, ...
	i=$((i + 1))
done
echo "bench-generate-big: model $model, computed in $compute; sides: $sides; batch $batch, $new new tokens, pool $pool (of it ${cache_mib} MiB of weights kept); GOMEMLIMIT ${memlimit:-unset}; in $work"
echo "  $(date -u +%FT%TZ) load average $(cut -d' ' -f1-3 /proc/loadavg); $(free -g | awk '/^Mem:/ {print "RAM " $2 " GiB, available " $7 " GiB"}'); disk free $(df -h --output=avail "$dir" | tail -1 | tr -d ' ')"
(
	ulimit -v 16000000
	"$bin" --model "$model" --make-model "$st" --seed 1
)
size_kib=$(($(stat -c %s "$st") / 1024))
run_side() { # side round
	out=$work/$1.$2.out
	echo "--- $1 (round $2) $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
	common="--model $model --safetensors $st --names vars --batch $batch --drop-cache --compute-dtype $compute"
	if [ "$1" = zinf ]; then
		common="$common --max-new-tokens $new"
	else
		common="$common --max-new-tokens $new_mmap"
	fi
	if [ "$1" = zinf ]; then
		# shellcheck disable=SC2086
		(
			ulimit -v $((16000000 + cache_mib * 1024)) # the pool is address space
			timeout "$limit" "$bin" $common $prompts --config "$work/config.json" --in-place-only --piece-bytes -1 --plan=false --max-in-cpu "${cache_mib}MiB"
		) >"$out" 2>&1 || { cat "$out"; echo "zinf side failed" >&2; return 1; }
	else
		# shellcheck disable=SC2086
		(
			ulimit -v $((size_kib + 16000000)) # the mapping is address space
			timeout "$limit" "$bin" $common $prompts --mmap "$1"
		) >"$out" 2>&1 || { cat "$out"; echo "$1 side failed" >&2; return 1; }
	fi
	grep -E '^(weights|  [0-9]+ tensors|step |tokens|decoding step|generated|process)' "$out"
	echo "  done $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
r=1
while [ "$r" -le "$rounds" ]; do
	order=$sides
	if [ $((r % 2)) = 0 ]; then
		order=$(echo "$sides" | tr ' ' '\n' | sed '1!G;h;$!d' | tr '\n' ' ')
	fi
	for s in $order; do
		run_side "$s" "$r"
	done
	r=$((r + 1))
done
echo "summary (tokens/s at the median full decoding step; zinf / side):"
# Greedy tokens agree where both sides generated (a side with fewer new
# tokens must give a prefix of the other's).
agree() { # file file
	awk 'FNR == 1 { f++ }
		/^tokens \[/ { gsub(/[][]/, " "); n = split($0, a, " "); k = a[2]; for (i = 4; i <= n; i++) t[f, k, i - 3] = a[i]; len[f, k] = n - 3; seqs[k] = 1 }
		END { ok = 1; for (k in seqs) { m = len[1, k] < len[2, k] ? len[1, k] : len[2, k]; if (m == 0) ok = 0; for (i = 1; i <= m; i++) if (t[1, k, i] != t[2, k, i]) ok = 0 } print (ok ? "true" : "false") }' "$1" "$2"
}
first=$(ls "$work"/*.out | head -1)
all_same=true
for f in "$work"/*.out; do
	same=$(agree "$first" "$f")
	[ "$same" = true ] || all_same=false
	printf '  %-14s %8s tokens/s; %s; greedy tokens agree with %s: %s\n' "$(basename "$f" .out)" "$(awk '/^tokens\/s: / {print $2}' "$f")" \
		"$(grep '^process:' "$f" | sed 's/^process: //')" "$(basename "$first" .out)" "$same"
done
for f in "$work"/*.out; do # zinf against each side of the same round
	case $f in */zinf.*) continue ;; esac
	n=$(basename "$f" .out)
	zt=$(awk '/^tokens\/s: / {print $2}' "$work/zinf.${n##*.}.out" 2>/dev/null || true)
	[ -z "$zt" ] || awk -v zt="$zt" -v n="$n" '/^tokens\/s: / {printf "  zinf / %s: %.2fx tokens/s\n", n, zt / $2}' "$f"
done
echo "greedy tokens equal across sides: $all_same"
[ "$all_same" = true ]
