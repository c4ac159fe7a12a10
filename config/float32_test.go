package config_test

import (
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestFloat32Hyperparameters: the optimizer computes in float32, so a
// value it cannot hold (it would become +Inf, or 0, or a beta of 1) is
// refused by the config, naming the key, the value and the float32 range,
// instead of reaching the optimizer as "Hyper.LR = +Inf" (or silently as
// 0). Values float32 holds are accepted.
func TestFloat32Hyperparameters(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"optimizer": {"params": {"lr": 1e308}}}`, "optimizer.params.lr: 1e308 is out of range: it becomes +Inf"},
		{`{"optimizer": {"params": {"lr": 1e-50}}}`, "optimizer.params.lr: 1e-50 is out of range: it becomes 0"},
		{`{"optimizer": {"params": {"eps": 1e39}}}`, "optimizer.params.eps: 1e39 is out of range"},
		{`{"optimizer": {"params": {"weight_decay": 1e300}}}`, "optimizer.params.weight_decay: 1e300 is out of range"},
		{`{"optimizer": {"params": {"betas": [0.9, 0.999999999]}}}`, "optimizer.params.betas[1]: 0.999999999 is out of range: it rounds to 1"},
		{`{"optimizer": {"type": "SGD", "params": {"momentum": 1e40}}}`, "optimizer.params.momentum: 1e40 is out of range"},
		{`{"optimizer": {"type": "SGD", "params": {"dampening": -1e40}}}`, "optimizer.params.dampening: -1e40 is out of range"},
		{`{"optimizer": {"type": "Adagrad", "params": {"lr_decay": 1e-300}}}`, "optimizer.params.lr_decay: 1e-300 is out of range"},
		{`{"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 1e39}}}`, "scheduler.params.warmup_max_lr: 1e39 is out of range"},
	} {
		_, err := config.Parse([]byte(c.in))
		if err == nil {
			t.Errorf("%s: accepted", c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "float32") {
			t.Errorf("%s:\n got %v\nwant %q and the float32 range", c.in, err, c.want)
		}
	}
	for _, in := range []string{
		`{"optimizer": {"params": {"lr": 3e38, "eps": 1e-44, "weight_decay": 0, "betas": [0, 0.99999994]}}}`,
		`{"optimizer": {"type": "SGD", "params": {"momentum": 0.9, "dampening": -0.5}}}`,
	} {
		if _, err := config.Parse([]byte(in)); err != nil {
			t.Errorf("%s: %v, want it accepted", in, err)
		}
	}
}
