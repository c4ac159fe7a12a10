#!/usr/bin/env bash
# make bench-schedule: the two orders of a step's micro-batches, layer-major
# and micro-batch-major, on the same model and disk, interleaved round by
# round, for k = 1, 4, 8 micro-batches (gradient_accumulation_steps), in a
# disk-bound configuration: parameters, gradients and optimizer states on
# NVMe, no parameter cache, little compute per layer. Before the runs the
# disk's read and write bandwidth are measured with zinf io and given to
# the planner (zinf.bandwidth), so the prediction sees this disk now.
# Reports per (k, order), medians over ROUNDS rounds with min..max:
# step time, predicted step (from the compute the runtime measured),
# NVMe parameter and total bytes read per step, peak RSS; then the ratios
# the issue sets: parameter bytes flat in k layer-major (within 5%),
# 2k-fold micro-batch-major, step time layer-major / micro-batch-major at
# k = 8, predicted / measured. Both orders must end in the same state.
# Knobs: ROUNDS (3), KS ("1 4 8"), LAYERS (8), WIDTH (1024), BATCH (1),
# STEPS (4), COMPUTE_MS (0.2, simulated per layer, pass and micro-batch),
# SCHED_DIR (the disk; default $TMPDIR or /var/tmp), CHECKSUMS (true: zinf.checksums).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}
ks=${KS:-"1 4 8"}
layers=${LAYERS:-8} width=${WIDTH:-1024} batch=${BATCH:-1} steps=${STEPS:-4} compute=${COMPUTE_MS:-0.2}
base=${SCHED_DIR:-${TMPDIR:-/var/tmp}}
tmp=$(mktemp -d "$base/zinf-bench-schedule.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "machine: $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg); disk: $tmp"
gbps() { ./bin/zinf io --path "$tmp" --size 64MiB --loops 3 --op "$1" --json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["gbps_median"], 3))'; }
# The disk's rate swings within a minute here (1-4.5 GB/s): each run's
# prediction is given the rate zinf io measures just before it.
mkcfg() {
  rd=$(gbps read); wr=$(gbps write)
  cat > "$tmp/ds.json" <<JSON
{
  "zero_optimization": {"stage": 3, "sub_group_size": 1048576,
    "offload_param": {"device": "nvme", "nvme_path": "$tmp", "max_in_cpu": 0},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$tmp"}},
  "zinf": {"tiers": {"cpu_pinned_bytes": "192MiB"}, "checksums": ${CHECKSUMS:-true},
           "bandwidth": {"read_bytes_per_sec": "${rd}GB", "write_bytes_per_sec": "${wr}GB"}}
}
JSON
}
for r in $(seq 1 "$rounds"); do
  for k in $ks; do
    for order in layer-major micro-batch-major; do
      mkcfg
      echo "PROBE $k $order $rd $wr" >> "$tmp/probes.txt"
      ./bin/zinf train --config "$tmp/ds.json" --layers "$layers" --width "$width" --batch "$batch" --steps "$steps" \
        --micro-batches "$k" --schedule "$order" --compute-ms-per-layer "$compute" --json --quiet \
        | sed "s/^/RUN $k $order /" >> "$tmp/runs.txt"
    done
  done
done
# B. Peak RSS of a layer-major step whose activations (32 MiB a step:
# 8 layers x 8 micro-batches x 512 KiB of layer input and pre-activations)
# live in memory, in pinned memory or on NVMe; micro-batch-major beside it
# (one micro-batch's activations at a time).
for r in $(seq 1 "$rounds"); do
  for dev in memory cpu nvme mbmajor; do
    sched=layer-major; d=$dev
    if [ "$dev" = mbmajor ]; then sched=micro-batch-major; d=memory; fi
    sed "s/\"tiers\"/\"activations\": {\"device\": \"$d\", \"cpu_bytes\": \"48MiB\"}, \"tiers\"/" "$tmp/ds.json" > "$tmp/act.json"
    ./bin/zinf train --config "$tmp/act.json" --layers 8 --width 256 --batch 256 --steps 2 --micro-batches 8 --schedule "$sched" --json --quiet \
      | sed "s/^/ACT $dev /" >> "$tmp/acts.txt"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/runs.txt" "$layers" "$width" "$batch" "$steps" "$compute" "$tmp/acts.txt" "$tmp/probes.txt" <<'PY'
import json, statistics, sys
probes = [tuple(map(float, l.split()[3:5])) for l in open(sys.argv[8])]
print(f"disk before each of the {len(probes)} runs (zinf io): read {min(p[0] for p in probes):.2f}..{max(p[0] for p in probes):.2f} GB/s, "
      f"write {min(p[1] for p in probes):.2f}..{max(p[1] for p in probes):.2f} GB/s")
runs = {}
for line in open(sys.argv[1]):
    _, k, order, js = line.split(" ", 3)
    runs.setdefault((int(k), order), []).append(json.loads(js))
layers, width, batch, steps, compute, actsfile = sys.argv[2:8]
def med(v): return statistics.median(v), min(v), max(v)
def fmt(t, unit="", scale=1.0, nd=1): return f"{t[0]/scale:.{nd}f}{unit} ({t[1]/scale:.{nd}f}..{t[2]/scale:.{nd}f})"
# A step's own figures: the median over the run's steps after the first.
def stepmed(r, key): return statistics.median(r[key][1:] or r[key])
print(f"\nzinf train --layers {layers} --width {width} --batch {batch} --steps {steps} --compute-ms-per-layer {compute} (fp32; params, grads, optimizer states on NVMe, max_in_cpu 0)")
print(f"{'k':>2} {'order':18} {'step ms':>24} {'predicted ms':>24} {'pred/meas':>9} {'param MB/step':>14} {'NVMe read MB/step':>18} {'peak RSS MiB':>12}")
table = {}
for (k, order) in sorted(runs, key=lambda x: (x[0], x[1] != "layer-major")):
    rs = runs[(k, order)]
    st = med([r["step_ms_median"] for r in rs])
    pr = med([r["predicted_step_ms"] for r in rs])
    ratio = med([r["predicted_step_ms"] / r["step_ms_median"] for r in rs])
    pb = med([stepmed(r, "step_param_read_bytes") for r in rs])
    rb = med([stepmed(r, "step_read_bytes") for r in rs])
    rss = med([r["peak_rss_bytes"] for r in rs])
    table[(k, order)] = dict(step=st[0], pb=pb[0], sha={r["state_sha256"] for r in rs}, ratio=ratio[0])
    print(f"{k:>2} {order:18} {fmt(st):>24} {fmt(pr):>24} {ratio[0]:9.2f} {pb[0]/1e6:14.1f} {rb[0]/1e6:18.1f} {rss[0]/2**20:12.0f}")
ks = sorted({k for k, _ in table})
k1 = ks[0]
print()
for k in ks:
    lm, mb = table[(k, "layer-major")], table[(k, "micro-batch-major")]
    same = "same state" if lm["sha"] == mb["sha"] and len(lm["sha"]) == 1 else f"STATES DIFFER {lm['sha']} {mb['sha']}"
    print(f"k={k}: param bytes per step vs k={k1}: layer-major {lm['pb']/table[(k1,'layer-major')]['pb']:.3f}x, "
          f"micro-batch-major {mb['pb']/table[(k1,'micro-batch-major')]['pb']:.2f}x (2k/2 = {k/k1:.0f}x); "
          f"step time layer-major / micro-batch-major {lm['step']/mb['step']:.2f}; {same}")
acts = {}
for line in open(actsfile):
    _, dev, js = line.split(" ", 2)
    acts.setdefault(dev, []).append(json.loads(js))
print("\nB. zinf train --layers 8 --width 256 --batch 256 --steps 2 --micro-batches 8: a step's activations (32 MiB layer-major) by tier")
print(f"{'activations':28} {'peak RSS MiB':>22} {'step ms':>26} {'tier peak MiB':>14}")
for dev in ["memory", "cpu", "nvme", "mbmajor"]:
    rs = acts.get(dev, [])
    if not rs:
        continue
    rss = med([r["peak_rss_bytes"] / 2**20 for r in rs])
    st = med([r["step_ms_median"] for r in rs])
    a = rs[0].get("activations") or {}
    peak = max(a.get("peak_memory_bytes", 0), a.get("peak_pinned_bytes", 0), a.get("peak_nvme_bytes", 0)) / 2**20
    name = "micro-batch-major (in memory)" if dev == "mbmajor" else f"layer-major, {dev}"
    shas = {r["state_sha256"] for r in rs}
    print(f"{name:28} {fmt(rss, nd=0):>22} {fmt(st):>26} {peak:14.1f}")
allsha = {r["state_sha256"] for rs in acts.values() for r in rs}
print(f"final state: {'the same in every run' if len(allsha) == 1 else 'DIFFERS: ' + str(allsha)}")
PY
