#!/usr/bin/env bash
# The arm64 (NEON) kernels' mutation test under qemu-aarch64: mutants.sh
# for arm64 (make test-arm64 runs that directly); this name stays for
# the places that cite it.
exec "$(dirname "$0")/mutants.sh" arm64 "$@"
