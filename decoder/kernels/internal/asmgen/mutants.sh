#!/usr/bin/env bash
# The decoder kernels' mutation test, for one architecture:
#
#	decoder/kernels/internal/asmgen/mutants.sh [amd64|arm64]
#
# amd64 (the default): the AVX2 kernels, run natively; needs an amd64
# machine with AVX2, FMA and F16C. arm64: the NEON kernels, run under
# qemu-aarch64 (QEMU_AARCH64 names the emulator; Debian's package:
# qemu-user), after the whole package's tests pass there on an emulated
# CPU with the dot product instructions (-cpu max: both NEON kernels,
# the SDOT one and the ARMv8.0 one, are tested) and the differential
# tests on one without them (cortex-a53: the ARMv8.0 kernel alone, and
# no SDOT may run).
#
# Either way the generated files must be what the generator writes today,
# and every deviation the generator can build into the assembly (asmgen
# -mutate, -neon-mutate) must make the differential tests of
# decoder/kernels fail, so that a pass means they can tell a wrong kernel
# apart. The tree is never modified: a mutant reaches the build through
# go's -overlay.
set -euo pipefail
arch=${1:-amd64}
cd "$(dirname "$0")"
pkg=$(cd ../.. && pwd)
diffs='^(TestKernelsMatchScalar|TestKernelsLongRows|TestQuantizedKernelsExtremes|TestInOutKernelsMatchScalar|TestInOutKernelsLongRows|TestQuantizeKernelsMatch)$'

# Per architecture: name (what messages start with), from (the generated
# files' first line compared: amd64's first line names the command's
# output paths), found (what a differential failure's message starts
# with), and the functions generate OUT.s OUT.go (the kernels), mutants
# (the list), mutant NAME (writes $out/mutant.s; arm64 also builds the
# test binary, and a failed build stops the script) and run_diffs LOG (the
# differential tests with the mutant in the build; fails when they do).
case $arch in
amd64)
  name=mutants from=2 found='avx2, .*'
  generate() { go run . -out "$1" -stubs "$2" -pkg kernels; }
  mutants() { go run . -mutate list; }
  mutant() { go run . -mutate "$1" -out "$out/mutant.s" -stubs "$out/mutant.go" -pkg kernels; }
  run_diffs() { (cd "$pkg" && go test -overlay "$out/overlay.json" -count=1 -run "$diffs" . >"$1" 2>&1); }
  ;;
arm64)
  name=neon-mutants from=1 found='neon[a-z-]*, .*'
  emu=${QEMU_AARCH64:-qemu-aarch64}
  if ! command -v "$emu" >/dev/null 2>&1; then
    echo "$name: $emu not found (QEMU_AARCH64 names the emulator; Debian's package: qemu-user)" >&2
    exit 1
  fi
  generate() { go run . -neon "$1" -neonstubs "$2"; }
  mutants() { go run . -neon-mutate list; }
  mutant() {
    go run . -neon "$out/mutant.s" -neon-mutate "$1"
    (cd "$pkg" && GOARCH=arm64 CGO_ENABLED=0 go test -overlay "$out/overlay.json" -c -o "$out/mutant.test" .)
  }
  run_diffs() { (cd "$pkg" && QEMU_CPU=max "$emu" "$out/mutant.test" -test.count=1 -test.run "$diffs" >"$1" 2>&1); }
  ;;
*)
  echo "mutants: architecture $arch: allowed are amd64 and arm64" >&2
  exit 2
  ;;
esac

out=$(mktemp -d "${TMPDIR:-/tmp}/zinf-kernels-$name.XXXXXX")
trap 'rm -rf "$out"' EXIT

generate "$out/gen.s" "$out/gen.go"
for f in "kernel_$arch.s:gen.s" "kernel_${arch}_stubs.go:gen.go"; do
  cmp -s <(tail -n "+$from" "$out/${f#*:}") <(tail -n "+$from" "$pkg/${f%%:*}") ||
    { echo "$name: ${f%%:*} differs from what asmgen writes: run go generate in decoder/kernels" >&2; exit 1; }
done

if [ "$arch" = arm64 ]; then
  echo "== decoder/kernels on arm64 (under $emu)"
  (cd "$pkg" && GOARCH=arm64 go vet . && GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$out/kernels.test" .)
  (cd "$pkg" && QEMU_CPU=max ZINF_TEST_DOTPROD=1 "$emu" "$out/kernels.test" -test.count=1 -test.timeout=10m)
  echo "== decoder/kernels' differential tests on a CPU without the dot product instructions (qemu-aarch64 -cpu cortex-a53)"
  (cd "$pkg" && QEMU_CPU=cortex-a53 ZINF_TEST_DOTPROD=0 "$emu" "$out/kernels.test" -test.count=1 -test.timeout=10m \
    -test.run "${diffs%)\$}|TestNEONKernelsFollowTheCPU)\$")
fi

printf '{"Replace":{"%s":"%s"}}' "$pkg/kernel_$arch.s" "$out/mutant.s" >"$out/overlay.json"
survivors=()
n=0
for m in $(mutants); do
  n=$((n + 1))
  mutant "$m"
  if run_diffs "$out/mutant.log"; then
    echo "mutant $m: SURVIVED (the differential tests passed)"
    survivors+=("$m")
  elif grep -q 'scalar' "$out/mutant.log"; then
    echo "mutant $m: caught: $(grep -m1 -o "$found" "$out/mutant.log" | cut -c1-150)"
  else
    echo "mutant $m: the tests failed without a differential finding:" >&2
    tail -20 "$out/mutant.log" >&2
    survivors+=("$m")
  fi
done
if ((${#survivors[@]})); then
  echo "$name: ${#survivors[@]} of $n not caught: ${survivors[*]}" >&2
  exit 1
fi
echo "$name: all $n caught"
