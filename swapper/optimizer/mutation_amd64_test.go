package optimizer_test

import (
	"strings"
	"testing"

	"github.com/zinfio/zinf/swapper/optimizer"
)

// TestDifferentialTestsCatchMutants runs the differential tests of the
// rule kernels (diffRuleKernel, checkLionSign) on Go models of the SIMD
// kernels (optimizer.Mutants, in export_amd64_test.go): the faithful model
// must pass, and every model with one deviation (an addition's NaN operand
// order, a fused multiply-add, a reciprocal for a divide, the sign of ±0
// or of a NaN, a write past the end, a vector left out) must fail. A test
// that let one of them through could not be trusted with the assembly.
func TestDifferentialTestsCatchMutants(t *testing.T) {
	seed := uint64(time1())
	t.Logf("seed %d", seed)
	for _, m := range optimizer.Mutants() {
		t.Run(m.Name, func(t *testing.T) {
			if strings.HasPrefix(m.Name, "lion/sign-") {
				// The sign check alone must catch these too.
				if err := checkLionSign(m.Kernel); err == nil {
					t.Errorf("checkLionSign let the mutant %q through", m.Name)
				}
			}
			// A mutant of one rule is tested on that rule's cases.
			var rules []optimizer.Rule
			for prefix, r := range map[string]optimizer.Rule{"adam/": optimizer.RuleAdam, "sgd/": optimizer.RuleSGD, "adagrad/": optimizer.RuleAdagrad, "lion/": optimizer.RuleLion} {
				if strings.HasPrefix(m.Name, prefix) {
					rules = append(rules, r)
				}
			}
			_, err := diffRuleKernel(m.Kernel, seed, rules...)
			if err == nil {
				err = checkLionSign(m.Kernel)
			}
			switch {
			case m.Faithful && err != nil:
				t.Fatalf("the faithful model of the kernels differs from the scalar loops: %v", err)
			case !m.Faithful && err == nil:
				t.Fatalf("the differential tests let the mutant %q through", m.Name)
			case err != nil:
				t.Logf("caught: %v", err)
			}
		})
	}
}
