package plan

import (
	"reflect"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestSettingsMatchTranslators holds SettingsOf, the one pass zinf.Open and
// zinf.PlanModel read the config through, against the public translators the
// tools use: the same engine, GPUDirect Storage, bounce and optimizer
// options, dtype and mode, for configs that differ in each key they read.
func TestSettingsMatchTranslators(t *testing.T) {
	configs := map[string]func(c *config.Config){
		"default": func(*config.Config) {},
		"direct off, gds auto, bf16": func(c *config.Config) {
			c.Zinf.Direct = "off"
			c.Zinf.GDS = config.GDSAuto
			c.BF16 = true
		},
		"direct required, use_gds, fp16, sgd": func(c *config.Config) {
			c.Zinf.Direct = "required"
			c.AIO.UseGDS = true
			c.AIO.BlockSize = 5000
			c.AIO.IntraOpParallelism = 3
			c.FP16 = true
			c.Optimizer.Type = config.OptimizerSGD
			c.Zinf.NVMePaths = []string{t.TempDir(), t.TempDir()}
		},
	}
	for name, edit := range configs {
		c := config.Default()
		c.SetScratchDir(t.TempDir())
		edit(c)
		s := SettingsOf(c)
		if got, want := s.Engine, EngineOptions(c, nil, nil); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: engine %+v, EngineOptions %+v", name, got, want)
		}
		if got, want := s.GDS, GDSOptions(c, nil); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: gds %+v, GDSOptions %+v", name, got, want)
		}
		if got, want := s.Bounce, BounceOptions(c, nil); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: bounce %+v, BounceOptions %+v", name, got, want)
		}
		if s.GDSMode != GDSMode(c) || s.DType != ParamDType(c) || s.Optimizer.Hyper != Hyper(c) {
			t.Errorf("%s: mode %q dtype %v hyper %+v; want %q %v %+v", name, s.GDSMode, s.DType, s.Optimizer.Hyper, GDSMode(c), ParamDType(c), Hyper(c))
		}
		if !reflect.DeepEqual(s.NVMePaths, c.NVMePaths()) {
			t.Errorf("%s: paths %v, want %v", name, s.NVMePaths, c.NVMePaths())
		}
	}
}
