package optimizer_test

import (
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestAdam8AVX512Candidate runs the 8-bit differential test on the
// generated AVX-512 body, which the avx512 kernel does not dispatch to
// until it has passed this on an AVX-512 CPU.
func TestAdam8AVX512Candidate(t *testing.T) {
	k, ok := optimizer.Adam8AVX512Candidate()
	if !ok {
		t.Skip("no AVX-512 on this CPU")
	}
	seed := uint64(time1())
	t.Logf("seed %d", seed)
	if err := diffAdam8(k, seed); err != nil {
		t.Fatal(err)
	}
}
