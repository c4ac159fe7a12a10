//go:build !race

package layerexec_test

// raceEnabled: see race_test.go.
const raceEnabled = false
