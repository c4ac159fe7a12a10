#!/usr/bin/env bash
# make bench-mpi: zinf's ranks as MPI processes on this machine.
#  A. zinf train under mpirun -np 1, 2, 4: step time (median of the run's
#     steps) and the bytes the collectives move per step and rank,
#     interleaved round by round.
#  B. The comm binding's all-gather and reduce-scatter against Open MPI's
#     own blocking collectives (MPI_Allgather, MPI_Reduce_scatter_block,
#     MPI_Alltoall plus a rank-ordered sum) in the same job, interleaved.
# Medians over ROUNDS rounds (default 5), min..max beside them. Ranks are
# oversubscribed on the machine's cores: say whether the machine was
# shared when quoting the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
worlds=${WORLDS:-"1 2 4"}
sizes=${SIZES_MIB:-"1,16,64"}
tmp=$(mktemp -d "${TMPDIR:-/var/tmp}/zinf-bench-mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,vader)
go test -c -tags mpi -o "$tmp/comm.test" ./comm
echo "machine: $(nproc) cores; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
train=(train --dir "$tmp" --layers 8 --width 512 --steps 6 --compute-ms-per-layer 5 --json --quiet)
for r in $(seq 1 "$rounds"); do
  for n in $worlds; do
    "${mpi[@]}" -np "$n" ./bin/zinf-mpi "${train[@]}" | grep '^{' | sed "s/^/TRAIN $n /" >> "$tmp/train.txt"
  done
done
for n in $worlds; do
  [ "$n" = 1 ] && continue
  ZINF_MPI_CASE=bench ZINF_MPI_BENCH_MIB=$sizes ZINF_MPI_BENCH_ROUNDS=$rounds \
    "${mpi[@]}" -np "$n" "$tmp/comm.test" -test.run '^TestMPIRank$' | grep '^BENCH ' >> "$tmp/bench.txt"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/train.txt" "$tmp/bench.txt" <<'PY'
import json, statistics, sys
def med(v): return statistics.median(v), min(v), max(v)
train = {}
for line in open(sys.argv[1]):
    _, n, js = line.split(" ", 2)
    train.setdefault(int(n), []).append(json.loads(js))
print("\nA. zinf train --layers 8 --width 512 --steps 6 --compute-ms-per-layer 5 (fp32, everything on NVMe), per world size:")
print("   ranks  step ms median (min..max over rounds)   collectives per step, rank 0 / max rank   gather wait ms/step (rank 0)")
for n in sorted(train):
    rs = train[n]
    st = med([r["step_ms_median"] for r in rs])
    d = [r.get("distributed") or {} for r in rs]
    b0 = med([x.get("comm_bytes_per_step_rank0", 0) / 2**20 for x in d])
    bm = med([x.get("comm_bytes_per_step_max", 0) / 2**20 for x in d])
    gw = med([x.get("gather_wait_ms_per_step_rank0", 0) for x in d])
    sha = {r["state_sha256"] for r in rs}
    print(f"   {n:5d}  {st[0]:7.1f} ({st[1]:.1f}..{st[2]:.1f})                  {b0[0]:6.2f} MiB / {bm[0]:6.2f} MiB                  {gw[0]:6.1f} ({gw[1]:.1f}..{gw[2]:.1f})   [{len(rs)} rounds, {len(sha)} distinct final state(s)]")
bench = {}
for line in open(sys.argv[2]):
    d = json.loads(line[len("BENCH "):])
    bench.setdefault((d["ranks"], d["bytes"], d["op"]), []).append(d["seconds"])
print("\nB. collectives of one full vector, GB/s = vector bytes / time of the slowest rank (median, min..max over rounds):")
base = {"all-gather": "all-gather bare MPI_Allgather", "reduce-scatter": "reduce-scatter bare MPI_Reduce_scatter_block"}
for (ranks, size, op) in sorted(bench):
    t = med(bench[(ranks, size, op)])
    kind = op.split(" ")[0]
    ref = bench.get((ranks, size, base[kind]))
    ratio = f"{statistics.median(ref) / t[0]:5.2f}x of bare" if ref else ""
    print(f"   {ranks} ranks {size >> 20:4d} MiB  {op:48s} {size / t[0] / 1e9:6.2f} GB/s ({size / t[2] / 1e9:.2f}..{size / t[1] / 1e9:.2f})  {ratio}")
PY
