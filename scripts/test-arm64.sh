#!/usr/bin/env bash
# make test-arm64: the optimizer package (its NEON kernels against the
# scalar loops, bit for bit, and everything else in it) built for arm64
# and run under qemu-aarch64; then every mutant the generator can build
# into the NEON kernels (asmgen -mutate) must make the differential tests
# fail, so that a pass means the tests can tell a wrong kernel apart.
# Needs qemu-user (Debian: apt-get install qemu-user); .ci/run installs it.
# The tree is never modified: a mutant reaches the build through go's
# -overlay.
set -euo pipefail
cd "$(dirname "$0")/.."
emu=${QEMU_AARCH64:-qemu-aarch64}
if ! command -v "$emu" >/dev/null 2>&1; then
  echo "test-arm64: $emu not found (QEMU_AARCH64 names the emulator; Debian's package: qemu-user)" >&2
  exit 1
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/zinf-arm64.XXXXXX")
trap 'rm -rf "$out"' EXIT
root=$PWD

# The generated files are what the generator writes today.
(cd swapper/optimizer/internal/asmgen && go run . -neon "$out/gen.s" -neonstubs "$out/gen.go")
cmp -s "$out/gen.s" swapper/optimizer/kernel_arm64.s || { echo "test-arm64: kernel_arm64.s differs from what asmgen writes: run go generate in swapper/optimizer" >&2; exit 1; }
cmp -s "$out/gen.go" swapper/optimizer/kernel_arm64_stubs.go || { echo "test-arm64: kernel_arm64_stubs.go differs from what asmgen writes: run go generate in swapper/optimizer" >&2; exit 1; }

echo "== swapper/optimizer on arm64 (under $emu)"
GOARCH=arm64 go vet ./swapper/optimizer/
GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$out/optimizer.test" ./swapper/optimizer/
(cd swapper/optimizer && ZINF_TEST_EXEC="$emu" "$emu" "$out/optimizer.test" -test.count=1 -test.timeout=10m ${TESTARGS:-})

echo "== NEON mutants: each must fail the differential tests"
diffs='^(TestKernelsMatchScalar|TestRuleKernelsMatchScalar|TestKernelsLong)$'
survivors=()
n=0
while read -r m; do
  n=$((n + 1))
  (cd swapper/optimizer/internal/asmgen && go run . -neon "$out/mutant.s" -mutate "$m")
  printf '{"Replace":{"%s":"%s"}}' "$root/swapper/optimizer/kernel_arm64.s" "$out/mutant.s" >"$out/overlay.json"
  GOARCH=arm64 CGO_ENABLED=0 go test -overlay "$out/overlay.json" -c -o "$out/mutant.test" ./swapper/optimizer/
  if (cd swapper/optimizer && "$emu" "$out/mutant.test" -test.count=1 -test.run "$diffs" >"$out/mutant.log" 2>&1); then
    echo "  $m: SURVIVED (the tests passed)"
    survivors+=("$m")
  elif grep -q -- '--- FAIL: Test' "$out/mutant.log"; then
    echo "  $m: caught: $(grep -m1 -E 'vs scalar|differ|want' "$out/mutant.log" | sed 's/^[[:space:]]*//' | cut -c1-160)"
  else
    echo "  $m: the test binary failed without a test failing:" >&2
    tail -20 "$out/mutant.log" >&2
    exit 1
  fi
done < <(cd swapper/optimizer/internal/asmgen && go run . -mutate list)
if [ ${#survivors[@]} -gt 0 ]; then
  echo "test-arm64: ${#survivors[@]} of $n mutants survived: ${survivors[*]}" >&2
  exit 1
fi
echo "test-arm64: ok; $n of $n mutants caught"
