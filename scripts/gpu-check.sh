#!/usr/bin/env bash
# The GPU tier's checks on a machine with an NVIDIA GPU, in one pass
# (gds/GPU_TESTING.md, steps 1-4): run from the repository root with the
# binaries of `make gpu-tests` in .gpu/ (and optionally a fio build in
# .gpu/fio/, fio's source in .gpu/fio-src.tgz for a libcufile build).
# Output goes to $OUT (default ./gpu-out): log, JSON lines per run.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
NVME=${NVME:-/var/tmp/zinf-gpu}; mkdir -p "$NVME"
step() { echo; echo "=== $* ($(date +%T))"; }
step machine
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
uname -r; nvcc --version 2>/dev/null | tail -2
df -hT "$NVME" | tail -1; lsmod 2>/dev/null | grep -E 'nvidia_fs|nvidia ' || echo "no nvidia_fs module listed"
python3 -m pip show nvidia-cufile nvidia-nccl-cu13 2>/dev/null | grep -E '^(Name|Version|Location)'
# The first match, resolved to the file itself (the CUDA toolkit's
# libcufile.so is a chain of links).
libdir() { local f; f=$(find /usr/local /opt /usr/lib /usr/lib64 -name "$1" 2>/dev/null | head -1); [ -n "$f" ] && readlink -f "$f"; }
# GPU_STEPS picks steps (default all): doctor cuda gds nccl train io.
GPU_STEPS=${GPU_STEPS:-doctor cuda gds nccl train io}
want() { case " $GPU_STEPS " in *" $1 "*) return 0;; esac; return 1; }
export ZINF_CUFILE_LIBRARY=${ZINF_CUFILE_LIBRARY:-$(libdir 'libcufile.so*')}
export ZINF_NCCL_LIBRARY=${ZINF_NCCL_LIBRARY:-$(libdir 'libnccl.so*')}
echo "cufile: $ZINF_CUFILE_LIBRARY"; echo "nccl: $ZINF_NCCL_LIBRARY"
# Without /etc/cufile.json (cuFile from pip) the library's defaults apply;
# a machine without the nvidia-fs module needs compatibility mode allowed.
[ -f /etc/cufile.json ] && { echo "/etc/cufile.json:"; grep -vE '^\s*//' /etc/cufile.json | grep -E 'compat|posix|level|"dir"|use_poll|force|io_uring|odirect' ; }
if [ -z "${CUFILE_ENV_PATH_JSON:-}" ] && { [ ! -f /etc/cufile.json ] || [ -n "${CUFILE_COMPAT:-}" ]; }; then
  mkdir -p /tmp/cufile-log
  printf '{"logging": {"dir": "/tmp/cufile-log", "level": "INFO"}, "properties": {"allow_compat_mode": %s%s}}\n' "${CUFILE_COMPAT:-true}" "${CUFILE_FORCE:+, \"force_compat_mode\": $CUFILE_FORCE}" > /tmp/cufile.json
  export CUFILE_ENV_PATH_JSON=/tmp/cufile.json; echo "cufile.json: $(cat /tmp/cufile.json)"
fi
ls /usr/local/cuda/gds/tools/gdscheck* 2>/dev/null && timeout 30 /usr/local/cuda/gds/tools/gdscheck -p
# fio with libcufile, built here in the background when cufile.h is found.
CUFILE_H=$(find /usr/local /opt /usr/include -name cufile.h 2>/dev/null | head -1)
FIOCF=""
if [ -n "$CUFILE_H" ] && [ -f .gpu/fio-src.tgz ]; then
  ( mkdir -p /tmp/fiocf && tar xzf .gpu/fio-src.tgz -C /tmp/fiocf && cd /tmp/fiocf/fio-3.33 &&
    CUINC=$(dirname "$CUFILE_H"); CULIB=/tmp/fiocf/lib; mkdir -p $CULIB;
    RT=$(find /usr/local /opt -name 'libcudart.so*' 2>/dev/null | head -1);
    ln -s "$ZINF_CUFILE_LIBRARY" $CULIB/libcufile.so; ln -s "$(readlink -f "$RT")" $CULIB/libcudart.so;
    CFLAGS="-I$CUINC -I/usr/local/cuda/include" LDFLAGS="-L$CULIB" \
      ./configure --enable-libcufile --disable-native >/tmp/fiocf.log 2>&1 && make -j12 >>/tmp/fiocf.log 2>&1 &&
    echo "$CULIB" > /tmp/fiocf/libpath ) &
  FIOBUILD=$!
fi
export ZINF_GPU_TESTS=1 ZINF_GPU_TEST_DIR=$NVME
want doctor && step doctor && timeout 60 .gpu/zinf doctor --path "$NVME"
want cuda && step cuda.test && timeout 240 .gpu/cuda.test -test.run '^TestGPU' -test.v -test.timeout 4m 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'
want gds && step gds.test && timeout 300 .gpu/gds.test -test.run '^TestGPU' -test.v -test.timeout 5m 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'
want nccl && step nccl.test && timeout 240 .gpu/nccl.test -test.run '^TestGPU' -test.v -test.timeout 4m 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'
if want train || want gds; then step train
cat > "$NVME/zinf-cuda.json" <<JSON
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
  "bf16": {"enabled": true},
  "zero_optimization": {
    "stage": 3,
    "sub_group_size": 1048576,
    "offload_param": {"device": "nvme", "nvme_path": "$NVME", "buffer_count": 5, "buffer_size": 1048576, "max_in_cpu": 0, "pin_memory": true},
    "offload_optimizer": {"device": "nvme", "nvme_path": "$NVME", "buffer_count": 4, "pin_memory": true, "ratio": 1.0}
  },
  "aio": {"block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 4, "single_submit": false, "overlap_events": true, "use_gds": true},
  "zinf": {"device": "cuda", "tiers": {"gpu_bytes": "2GiB", "cpu_pinned_bytes": "256MiB"}, "checksums": true, "direct": "optional", "gds": "auto"}
}
JSON
timeout 120 .gpu/zinf train --config "$NVME/zinf-cuda.json" --verify --steps 5 2>&1 | tail -15
want train && timeout 180 .gpu/zinf train --config "$NVME/zinf-cuda.json" --verify --steps 5 --layers 24 --width 2048 --json > "$OUT/train-cuda.json" 2>/tmp/train-cuda.err; echo "rc $?"; tail -5 /tmp/train-cuda.err
grep -o '"bitwise_equal":[a-z]*' "$OUT/train-cuda.json"; true
sed 's/"gds": "auto"/"gds": "required"/' "$NVME/zinf-cuda.json" > "$NVME/zinf-cuda-required.json"
timeout 120 .gpu/zinf train --config "$NVME/zinf-cuda-required.json" --verify --steps 3 2>&1 | tail -8
fi
want io || exit 0
step io
[ -n "${FIOBUILD:-}" ] && { wait $FIOBUILD; tail -3 /tmp/fiocf.log; }
if [ -x /tmp/fiocf/fio-3.33/fio ]; then FIO=/tmp/fiocf/fio-3.33/fio; export LD_LIBRARY_PATH=$(cat /tmp/fiocf/libpath):${LD_LIBRARY_PATH:-}; CF=1;
else FIO=.gpu/fio/fio; export LD_LIBRARY_PATH=$PWD/.gpu/fio:${LD_LIBRARY_PATH:-}; CF=0; fi
echo "fio: $FIO (libcufile engine: $CF)"
F=zinf-gpu-1g.dat
Z=".gpu/zinf io --device cuda --path $NVME --file $F --size 1GiB --block-size 1MiB --keep --json --loops 3"
# Writes go to a file each run creates and removes (zinf io never
# overwrites a file it did not create in the same run).
ZW=".gpu/zinf io --device cuda --path $NVME --file zinf-gpu-w.dat --size 1GiB --block-size 1MiB --json --loops 3"
FH="$FIO --name=host --filename=$NVME/$F --size=1g --bs=1m --direct=1 --ioengine=io_uring --iodepth=32 --output-format=json"
FC="$FIO --name=gpu --filename=$NVME/$F --size=1g --bs=1m --direct=1 --ioengine=libcufile --gpu_dev_ids=0 --output-format=json"
timeout 60 $Z --gpu --op write --queue-depth 32 --verify > /tmp/create.json; cat /tmp/create.json
timeout 60 $ZW --gpu --gds --op write --parallel 8 --verify >> /tmp/create.json; tail -1 /tmp/create.json
for round in 1 2 3; do
  for op in read write; do
    if [ $op = read ]; then Zop=$Z; else Zop=$ZW; fi
    timeout 60 $Zop --gpu --op $op --queue-depth 32 >> "$OUT/zinf-bounce.jsonl"
    timeout 60 $Zop --gpu --gds --op $op --parallel 8 >> "$OUT/zinf-gds.jsonl"
    if [ $op = read ]; then FF=$NVME/$F; else FF=$NVME/fio-w.dat; fi
    timeout 60 $FH --filename=$FF --rw=$op | tr -d '\n' >> "$OUT/fio-host.json"; echo >> "$OUT/fio-host.json"
    if [ $CF = 1 ]; then
      timeout 60 $FC --filename=$FF --rw=$op --cuda_io=posix | tr -d '\n' >> "$OUT/fio-posix.json"; echo >> "$OUT/fio-posix.json"
      timeout 60 $FC --filename=$FF --rw=$op --cuda_io=cufile | tr -d '\n' >> "$OUT/fio-cufile.json"; echo >> "$OUT/fio-cufile.json"
    fi
  done
  echo "round $round done ($(date +%T))"
done
timeout 60 $Z --gpu --op read --queue-depth 32 --verify | tail -1
timeout 60 $Z --gpu --gds --op read --parallel 8 --verify | tail -1
rm -f "$NVME/$F" "$NVME/fio-w.dat"
step summary
python3 - "$OUT" <<'PY'
import json,sys,os,statistics as st
out=sys.argv[1]
def lines(f):
    p=os.path.join(out,f)
    out=[]
    for l in (open(p) if os.path.exists(p) else []):
        try: out.append(json.loads(l))
        except ValueError: pass  # a run that failed printed no JSON
    return out
for f in ("zinf-bounce.jsonl","zinf-gds.jsonl"):
    for op in ("read","write"):
        v=[r["gbps_median"] for r in lines(f) if r.get("op")==op]
        if v: print(f, op, "medians", v, "median", st.median(v), "device", {r.get("device") for r in lines(f)}, "mode", {r.get("mode") for r in lines(f)})
for f in ("fio-host.json","fio-posix.json","fio-cufile.json"):
    rs=lines(f)
    for op in ("read","write"):
        v=[r["jobs"][0][op]["bw_bytes"]/1e9 for r in rs if r["jobs"][0][op]["bw_bytes"]>0]
        if v: print(f, op, "GB/s", [round(x,3) for x in v], "median", round(st.median(v),3))
PY
step cufile log; cat /tmp/cufile-log/*.log 2>/dev/null | grep -E 'ERROR|WARN|compat' | sed 's/^.*\] //' | sort | uniq -c | head -30
echo "=== end ($(date +%T))"
