//go:build race

package layerexec_test

// raceEnabled: the race detector's sync.Pool drops a quarter of what is
// put in it, at random, so pooled buffers come back less often.
const raceEnabled = true
