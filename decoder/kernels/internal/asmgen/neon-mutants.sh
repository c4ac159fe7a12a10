#!/usr/bin/env bash
# The arm64 (NEON) kernels' mutation test, under qemu-aarch64: the
# generated files must be what the generator writes today, the package's
# tests must pass on arm64, and every deviation the generator can build
# into the NEON assembly (asmgen -neon-mutate) must make the differential
# tests fail. Needs qemu-user (QEMU_AARCH64 names the emulator). The tree
# is never modified: a mutant reaches the build through go's -overlay.
#
#	decoder/kernels/internal/asmgen/neon-mutants.sh
set -euo pipefail
cd "$(dirname "$0")"
emu=${QEMU_AARCH64:-qemu-aarch64}
if ! command -v "$emu" >/dev/null 2>&1; then
  echo "neon-mutants: $emu not found (QEMU_AARCH64 names the emulator; Debian's package: qemu-user)" >&2
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/zinf-kernels-neon.XXXXXX")
trap 'rm -rf "$out"' EXIT
pkg=$(cd ../.. && pwd)

go run . -neon "$out/gen.s" -neonstubs "$out/gen.go"
cmp -s "$out/gen.s" "$pkg/kernel_arm64.s" || { echo "neon-mutants: kernel_arm64.s differs from what asmgen writes: run go generate in decoder/kernels" >&2; exit 1; }
cmp -s "$out/gen.go" "$pkg/kernel_arm64_stubs.go" || { echo "neon-mutants: kernel_arm64_stubs.go differs from what asmgen writes: run go generate in decoder/kernels" >&2; exit 1; }

echo "== decoder/kernels on arm64 (under $emu)"
(cd "$pkg" && GOARCH=arm64 go vet . && GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$out/kernels.test" .)
(cd "$pkg" && "$emu" "$out/kernels.test" -test.count=1 -test.timeout=10m)

diffs='^(TestKernelsMatchScalar|TestKernelsLongRows|TestInOutKernelsMatchScalar|TestInOutKernelsLongRows)$'
survivors=()
n=0
for m in $(go run . -neon-mutate list); do
  n=$((n + 1))
  go run . -neon "$out/mutant.s" -neon-mutate "$m"
  printf '{"Replace":{"%s":"%s"}}' "$pkg/kernel_arm64.s" "$out/mutant.s" >"$out/overlay.json"
  (cd "$pkg" && GOARCH=arm64 CGO_ENABLED=0 go test -overlay "$out/overlay.json" -c -o "$out/mutant.test" .)
  if (cd "$pkg" && "$emu" "$out/mutant.test" -test.count=1 -test.run "$diffs" >"$out/mutant.log" 2>&1); then
    echo "mutant $m: SURVIVED (the differential tests passed)"
    survivors+=("$m")
  elif grep -q 'scalar' "$out/mutant.log"; then
    echo "mutant $m: caught: $(grep -m1 -o 'neon, .*' "$out/mutant.log" | cut -c1-150)"
  else
    echo "mutant $m: the tests failed without a differential finding:" >&2
    tail -20 "$out/mutant.log" >&2
    survivors+=("$m")
  fi
done
if ((${#survivors[@]})); then
  echo "neon-mutants: ${#survivors[@]} of $n not caught: ${survivors[*]}" >&2
  exit 1
fi
echo "neon-mutants: all $n caught"
