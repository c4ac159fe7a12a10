#!/bin/sh
# make stress: every test at stress scale, then every fuzz target.
#
#   ZINF_STRESS=1 turns up the tests that have a knob: TestMetamorphic runs
#   ZINF_STRESS_SEEDS seeds (random models, pools, call orders and injected
#   faults), checkpoint's TestCrashSafety kills a writer at 60 points instead
#   of 8, zinf train's SIGKILL-and-resume test kills at every crash point it
#   reaches, the optimizer's TestRandomFaults runs 80 faulted steps, the pool's
#   TestConcurrentStress and the planner's TestPlanProperties 10x their
#   iterations, and under mpirun (when Open MPI is installed) comm's
#   TestStressMPI runs bigger random collectives at 2 to 6 ranks and zinf
#   train's TestStressMPIKills kills random ranks at random points and
#   resumes at random world sizes. With PKGS left at ./..., the GoMLX
#   adapter's module (contrib/gomlx) runs too, its large embedding tables
#   at 100000 rows instead of 20000.
#   Then each fuzz target (every func Fuzz* in a _test.go file) runs for
#   FUZZTIME: `go test -fuzz` takes one target per invocation, so they run
#   one after another. New failing inputs land in the package's
#   testdata/fuzz, as go test writes them. A target that fails without
#   writing one (Go 1.26's coordinator deadline race) runs once more.
#
# Environment: GO (go), PKGS (./...), FUZZTIME (2m), ZINF_STRESS_SEEDS (200),
# STRESS_TESTS=0 to fuzz only, STRESS_FUZZ=0 to skip fuzzing.
set -eu
GO=${GO:-go}
PKGS=${PKGS:-./...}
FUZZTIME=${FUZZTIME:-2m}
ZINF_STRESS=1
ZINF_STRESS_SEEDS=${ZINF_STRESS_SEEDS:-200}
export ZINF_STRESS ZINF_STRESS_SEEDS
cd "$(dirname "$0")/.."

# Both phases run whatever the other finds; the exit status says whether
# anything failed.
failed=""
if [ "${STRESS_TESTS:-1}" != 0 ]; then
	echo "== stress: go test -race at stress scale ($ZINF_STRESS_SEEDS metamorphic seeds) on $PKGS"
	# shellcheck disable=SC2086
	$GO test -race -count=1 -timeout 120m $PKGS || failed="$failed tests"
	# The GoMLX adapter is its own module: its scale-sized cases (tables
	# of a real vocabulary's rows) run only here, with make test-contrib's
	# flags.
	if [ "$PKGS" = ./... ]; then
		echo "== stress: go test -race at stress scale on contrib/gomlx"
		(cd contrib/gomlx && $GO test -race -gcflags=all=-d=checkptr=0 -count=1 -timeout 120m ./...) || failed="$failed contrib-tests"
	fi
fi

if [ "${STRESS_FUZZ:-1}" != 0 ]; then
	targets=$(grep -rl --include='*_test.go' '^func Fuzz' . | sort)
	for f in $targets; do
		dir=$(dirname "${f#./}")
		# A target in a nested module (contrib/gomlx) runs from that
		# module's root: the core module does not contain its packages.
		mod=.
		d=$dir
		while [ "$d" != . ]; do
			if [ -f "$d/go.mod" ]; then mod=$d; break; fi
			d=$(dirname "$d")
		done
		if [ "$mod" = . ]; then pkg=./$dir; elif [ "$dir" = "$mod" ]; then pkg=.; else pkg=./${dir#"$mod"/}; fi
		for t in $(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$f"); do
			echo "== stress: fuzz $mod $pkg $t for $FUZZTIME"
			corpus=$dir/testdata/fuzz/$t
			inputs() { ls "$corpus" 2>/dev/null | wc -l; }
			before=$(inputs)
			if ! (cd "$mod" && $GO test -run '^$' -fuzz "^$t\$" -fuzztime "$FUZZTIME" "$pkg"); then
				if [ "$(inputs)" != "$before" ]; then
					failed="$failed $t" # a failing input, written to $corpus
				else
					# Go 1.26's fuzzing coordinator can fail a target at the
					# -fuzztime deadline with "context deadline exceeded" and
					# no input (go.dev/issue/75804, fixed in Go 1.27): once
					# more, and a second failure counts.
					echo "== stress: $t failed without a failing input; running it once more"
					(cd "$mod" && $GO test -run '^$' -fuzz "^$t\$" -fuzztime "$FUZZTIME" "$pkg") || failed="$failed $t"
				fi
			fi
		done
	done
fi
if [ -n "$failed" ]; then
	echo "== stress: FAILED:$failed"
	exit 1
fi
echo "== stress: done"
