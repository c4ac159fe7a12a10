package schedule_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/schedule"
)

// scheduleGolden is testdata/schedule_golden.json, written by
// scripts/schedule_golden.py: per case a DeepSpeed scheduler section and,
// per applied step, torch.optim.lr_scheduler's value where torch has the
// same shape and DeepSpeed's formula evaluated in Python doubles.
type scheduleGolden struct {
	Torch string `json:"torch"`
	Cases []struct {
		Name        string          `json:"name"`
		Scheduler   json.RawMessage `json:"scheduler"`
		OptimizerLR float64         `json:"optimizer_lr"`
		Steps       []struct {
			K            int      `json:"k"`
			FormulaLR    float64  `json:"formula_lr"`
			FormulaBeta1 *float64 `json:"formula_beta1"`
			TorchLR      *float64 `json:"torch_lr"`
			TorchBeta1   *float64 `json:"torch_beta1"`
		} `json:"steps"`
	} `json:"cases"`
}

// ulps64 is the distance between two float64s in units in the last place.
func ulps64(a, b float64) int64 {
	key := func(x float64) int64 {
		i := int64(math.Float64bits(x))
		if i < 0 {
			i = math.MinInt64 - i
		}
		return i
	}
	d := key(a) - key(b)
	if d < 0 {
		d = -d
	}
	return d
}

// Tolerances of TestSchedulesMatchGolden, in float64 ulps of the value.
//
//   - Against DeepSpeed's formulas evaluated in Python: the same float64
//     operations in the same order, so only ln and cos may differ: Go's
//     math.Log and math.Cos and the C library's are each within 1 ulp of
//     the exact value, not always the same ulp, and one ulp of gamma moves
//     the rate by at most a couple of ulps.
//   - Against torch: torch's closed forms compute the same shape in
//     another order (LinearLR: base*(start + (end-start)*e/T) against
//     DeepSpeed's min + (max-min)*e/T; CosineAnnealingLR: eta_min +
//     (base-eta_min)*(1+cos)/2 against base*(cmin + (1-cmin)*(1+cos)/2);
//     start_factor = min/max is itself rounded), each a few roundings
//     apart. Measured with torch 1.13: at most 4 ulps (the cosine's
//     warmup and decay); tolerance 8.
//   - The float32 the optimizer uses (the rate rounded once) agrees with
//     torch's rounded to float32 within 1 ulp.
const (
	formulaULPs = 4
	torchULPs   = 8
)

func TestSchedulesMatchGolden(t *testing.T) {
	raw, err := os.ReadFile("testdata/schedule_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g scheduleGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) == 0 {
		t.Fatal("no golden cases")
	}
	torchCompared := 0
	for _, c := range g.Cases {
		t.Run(c.Name, func(t *testing.T) {
			text := fmt.Sprintf(`{"optimizer": {"type": "Adam", "params": {"lr": %v}}, "scheduler": %s}`, c.OptimizerLR, c.Scheduler)
			cfg, err := config.Parse([]byte(text))
			if err != nil {
				t.Fatalf("config %s: %v", text, err)
			}
			s, err := schedule.FromConfig(cfg, 0)
			if err != nil {
				t.Fatal(err)
			}
			var worstFormula, worstTorch int64
			for _, st := range c.Steps {
				v := s.At(st.K)
				if d := ulps64(v.LR, st.FormulaLR); d > formulaULPs {
					t.Errorf("step %d: lr %v, DeepSpeed's formula %v (%d ulps)", st.K, v.LR, st.FormulaLR, d)
				} else {
					worstFormula = max(worstFormula, d)
				}
				if (st.FormulaBeta1 != nil) != v.Betas {
					t.Errorf("step %d: betas set %v, formula has beta1 %v", st.K, v.Betas, st.FormulaBeta1)
				} else if v.Betas {
					if d := ulps64(v.Beta1, *st.FormulaBeta1); d > formulaULPs || v.Beta2 != 0.99 {
						t.Errorf("step %d: betas (%v, %v), formula beta1 %v and 0.99", st.K, v.Beta1, v.Beta2, *st.FormulaBeta1)
					}
				}
				if st.TorchLR != nil {
					torchCompared++
					d := ulps64(v.LR, *st.TorchLR)
					if d > torchULPs {
						t.Errorf("step %d: lr %v, torch %v (%d ulps)", st.K, v.LR, *st.TorchLR, d)
					}
					worstTorch = max(worstTorch, d)
					if f, tf := float32(v.LR), float32(*st.TorchLR); f != tf && math.Nextafter32(f, tf) != tf {
						t.Errorf("step %d: float32 lr %v, torch's %v: more than 1 ulp apart", st.K, f, tf)
					}
				}
				if st.TorchBeta1 != nil {
					if d := ulps64(v.Beta1, *st.TorchBeta1); d > torchULPs {
						t.Errorf("step %d: beta1 %v, torch's momentum %v (%d ulps)", st.K, v.Beta1, *st.TorchBeta1, d)
					}
				}
			}
			t.Logf("largest differences: %d ulps from the formula, %d from torch", worstFormula, worstTorch)
		})
	}
	if torchCompared < 50 {
		t.Errorf("only %d steps compared with torch", torchCompared)
	}
}
