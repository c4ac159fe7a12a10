#!/usr/bin/env bash
# make demo-mpi: the simulated training as an MPI job of 4 ranks (Open
# MPI's mpirun, oversubscribed on this machine's cores): each rank a
# process with its own partition of every tensor, its own swap files and
# its own runtime; layers all-gathered, gradients reduce-scattered in rank
# order. Rank 0 prints the summary, whose final-state digest is then
# compared with the same training in one process (ranks simulated) at
# world size 4 and at world size 1 standing in for 4 data-parallel ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
np=${NP:-4}
dir=${1:-}
if [ -z "$dir" ]; then
  dir=$(mktemp -d "${TMPDIR:-/var/tmp}/zinf-demo-mpi.XXXXXX")
  trap 'rm -rf "$dir"' EXIT
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "demo-mpi: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 1
fi
args=(train --dir "$dir" --layers 8 --width 256 --steps 6 --compute-ms-per-layer 5)
# As root, on fewer cores than ranks, over shared memory, ranks unbound.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
echo "== zinf demo-mpi: mpirun -np $np zinf train (swap dir $dir)"
mpirun --oversubscribe --bind-to none --mca btl self,vader -np "$np" ./bin/zinf-mpi "${args[@]}" --verify | tee "$dir/mpi.out"
mpi=$(sed -n 's/.*final state sha256 //p' "$dir/mpi.out")
echo
echo "== the same training in one process: world size $np (ranks simulated), and world size 1 with --data-parallel $np"
inproc=$(WORLD_SIZE=$np ./bin/zinf-mpi "${args[@]}" --quiet | sed -n 's/.*final state sha256 //p')
one=$(WORLD_SIZE=1 ./bin/zinf-mpi "${args[@]}" --quiet --data-parallel "$np" | sed -n 's/.*final state sha256 //p')
echo "  mpirun -np $np:            $mpi"
echo "  in-process world $np:      $inproc"
echo "  world 1, data-parallel $np: $one"
if [ -n "$mpi" ] && [ "$mpi" = "$inproc" ] && [ "$mpi" = "$one" ]; then
  echo "  final weights and optimizer states: EQUAL, bit for bit"
else
  echo "  final states DIFFER" >&2
  exit 1
fi
