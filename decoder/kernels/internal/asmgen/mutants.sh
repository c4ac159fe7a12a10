#!/usr/bin/env bash
# The amd64 kernels' mutation test: the generated files must be what the
# generator writes today, and every deviation the generator can build
# into the assembly (asmgen -mutate) must make the differential tests of
# decoder/kernels fail, so that a pass means they can tell a wrong kernel
# apart. Needs an amd64 machine with AVX2, FMA and F16C. The tree is never
# modified: a mutant reaches the build through go's -overlay.
#
#	decoder/kernels/internal/asmgen/mutants.sh
set -euo pipefail
cd "$(dirname "$0")"
out=$(mktemp -d "${TMPDIR:-/tmp}/zinf-kernels-mutants.XXXXXX")
trap 'rm -rf "$out"' EXIT
pkg=$(cd ../.. && pwd)

go run . -out "$out/gen.s" -stubs "$out/gen.go" -pkg kernels
# The first line names the command's output paths.
cmp -s <(tail -n +2 "$out/gen.s") <(tail -n +2 "$pkg/kernel_amd64.s") || { echo "mutants: kernel_amd64.s differs from what asmgen writes: run go generate in decoder/kernels" >&2; exit 1; }
cmp -s <(tail -n +2 "$out/gen.go") <(tail -n +2 "$pkg/kernel_amd64_stubs.go") || { echo "mutants: kernel_amd64_stubs.go differs from what asmgen writes: run go generate in decoder/kernels" >&2; exit 1; }

diffs='^(TestKernelsMatchScalar|TestKernelsLongRows|TestInOutKernelsMatchScalar|TestInOutKernelsLongRows)$'
survivors=()
n=0
for m in $(go run . -mutate list); do
  n=$((n + 1))
  go run . -mutate "$m" -out "$out/mutant.s" -stubs "$out/mutant.go" -pkg kernels
  printf '{"Replace":{"%s":"%s"}}' "$pkg/kernel_amd64.s" "$out/mutant.s" >"$out/overlay.json"
  if (cd "$pkg" && go test -overlay "$out/overlay.json" -count=1 -run "$diffs" . >"$out/mutant.log" 2>&1); then
    echo "mutant $m: SURVIVED (the differential tests passed)"
    survivors+=("$m")
  elif grep -q 'scalar' "$out/mutant.log"; then
    echo "mutant $m: caught: $(grep -m1 -o 'avx2, .*' "$out/mutant.log" | cut -c1-150)"
  else
    echo "mutant $m: the tests failed without a differential finding:" >&2
    tail -20 "$out/mutant.log" >&2
    survivors+=("$m")
  fi
done
if ((${#survivors[@]})); then
  echo "mutants: ${#survivors[@]} of $n not caught: ${survivors[*]}" >&2
  exit 1
fi
echo "mutants: all $n caught"
