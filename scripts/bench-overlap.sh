#!/usr/bin/env bash
# make bench-overlap: the update overlapping the next forward
# (zinf.overlap_update) against Step waiting for the whole update, on the
# same model and disk, interleaved round by round (the order alternates
# each round). Parameters, gradients and optimizer states on NVMe, no
# parameter cache. Two step modes:
#   after-backward: gradient_clipping with speculation off, so the whole
#     update runs after the backward pass (it needs the global norm) -
#     the case the overlap is for;
#   speculative: no clipping, each layer's update starting during the
#     backward (StepTensor), only the backlog left at Step.
# For k micro-batches (layer-major for k > 1). Reports per (mode, k,
# overlap), medians over ROUNDS rounds with min..max: the median step
# (steps after the first), the whole run's step time per step (train_ms /
# steps: the last update's tail included), the optimizer time Step took,
# the forward's wait for the update per step; then on / off ratios. Every
# run of one k must end in the same state (state_sha256).
# Knobs: ROUNDS (5), KS ("1 4"), LAYERS (8), WIDTH (1024), STEPS (6),
# COMPUTE_MS (10, simulated per layer, pass and micro-batch), OV_DIR
# (the disk; default $TMPDIR or /var/tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
ks=${KS:-"1 4"}
layers=${LAYERS:-8} width=${WIDTH:-1024} steps=${STEPS:-6} compute=${COMPUTE_MS:-10}
base=${OV_DIR:-${TMPDIR:-/var/tmp}}
tmp=$(mktemp -d "$base/zinf-bench-overlap.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg); disk: $tmp"
cat > "$tmp/ds.json" <<JSON
{
  "zero_optimization": {"stage": 3, "sub_group_size": 1048576,
    "offload_param": {"device": "nvme", "nvme_path": "$tmp", "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp"}},
  "zinf": {"tiers": {"cpu_pinned_bytes": "192MiB"}, "checksums": true}
}
JSON
run() { # mode k overlap
  local flags=()
  if [ "$1" = after-backward ]; then flags=(--clip 1e9 --speculate never); fi
  local sched=micro-batch-major
  if [ "$2" -gt 1 ]; then sched=layer-major; fi
  ./bin/zinf train --config "$tmp/ds.json" --layers "$layers" --width "$width" --steps "$steps" \
    --micro-batches "$2" --schedule "$sched" --compute-ms-per-layer "$compute" "${flags[@]}" \
    --overlap-update="$3" --json --quiet | sed "s/^/RUN $1 $2 $3 /" >> "$tmp/runs.txt"
}
for r in $(seq 1 "$rounds"); do
  for mode in after-backward speculative; do
    for k in $ks; do
      if [ $((r % 2)) -eq 1 ]; then run "$mode" "$k" false; run "$mode" "$k" true
      else run "$mode" "$k" true; run "$mode" "$k" false; fi
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/runs.txt" "$layers" "$width" "$steps" "$compute" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, mode, k, ov, js = line.split(" ", 4)
    runs.setdefault((mode, int(k), ov == "true"), []).append(json.loads(js))
layers, width, steps, compute = sys.argv[2:6]
def med(v): return statistics.median(v), min(v), max(v)
def fmt(t, nd=1): return f"{t[0]:.{nd}f} ({t[1]:.{nd}f}..{t[2]:.{nd}f})"
print(f"model: {layers} layers x {width}^2, {steps} steps, {compute} ms simulated compute per layer, pass and micro-batch; "
      f"{len(next(iter(runs.values())))} rounds")
# One state per k (the same micro-batches), whatever the mode and overlap.
shas = {}
for (mode, k, ov), rs in runs.items():
    for r in rs:
        shas.setdefault(k, set()).add(r["state_sha256"])
for mode in ("after-backward", "speculative"):
    for k in sorted({k for (m, k, _) in runs if m == mode}):
        rows = {}
        for ov in (False, True):
            rs = runs[(mode, k, ov)]
            assert all(r["overlap_update"] == ov for r in rs), f"{mode} k={k}: overlap_update not {ov} in some run"
            step = med([statistics.median(r["step_ms"][1:]) for r in rs])
            whole = med([r["train_ms"] / len(r["step_ms"]) for r in rs])
            opt = med([r["optimizer_ms_median"] for r in rs])
            wait = med([r["update_wait_ms"] / len(r["step_ms"]) for r in rs])
            rows[ov] = (step, whole)
            print(f"{mode:15s} k={k} overlap_update={str(ov).lower():5s}  step {fmt(step)} ms   per step incl. the last update {fmt(whole)} ms   "
                  f"Step's optimizer time {fmt(opt)} ms   forward waited for the update {fmt(wait)} ms/step")
        pr = [statistics.median(a["step_ms"][1:]) / statistics.median(b["step_ms"][1:]) for a, b in zip(runs[(mode, k, True)], runs[(mode, k, False)])]
        print(f"{mode:15s} k={k} on / off, step (per round): {fmt(med(pr), 2)}; per step incl. the last update: "
              f"{rows[True][1][0] / rows[False][1][0]:.2f} (medians)")
bad = {k: v for k, v in shas.items() if len(v) != 1}
print(f"final state: {'for each k, the same in every run' if not bad else 'DIFFERS: ' + repr(bad)} (state_sha256)")
if bad:
    sys.exit(1)
PY
