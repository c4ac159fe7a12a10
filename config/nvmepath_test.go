package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// TestNVMePathRefused is the regression for nvme_path "/", "/etc" and
// ".." being accepted silently: a system directory, or a path with a ".."
// component, is refused in every key that names a swap directory, naming
// the key and the value. /dev/shm (RAM, not NVMe) is accepted here and
// warned about by zinf.Open.
func TestNVMePathRefused(t *testing.T) {
	sections := map[string]string{
		"zero_optimization.offload_param.nvme_path":     `{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": %q}}}`,
		"zero_optimization.offload_optimizer.nvme_path": `{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": %q}}}`,
		"zinf.nvme_paths[0]":                            `{"zinf": {"nvme_paths": [%q]}}`,
	}
	for key, format := range sections {
		for path, want := range map[string]string{
			"/": "is a system directory", "/etc": "is a system directory", "/etc/zinf": "is a system directory",
			"/usr/local/nvme": "is a system directory", "/proc/self": "is a system directory", "/sys": "is a system directory",
			"/dev": "is a system directory", "/dev/nvme0n1": "is a system directory", "/var": "is a system directory",
			"/var/": "is a system directory", "..": `has a ".." component`, "../nvme": `has a ".." component`,
			"/nvme/../etc": `has a ".." component`, "/nvme0/zinf/..": `has a ".." component`,
		} {
			_, err := config.Parse(fmt.Appendf(nil, format, path))
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Errorf("%s %q: accepted (%v)", key, path, err)
				continue
			}
			found := false
			for _, p := range ce.Problems {
				if p.Key == key && p.Value == fmt.Sprintf("%q", path) && strings.Contains(p.Msg, want) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s %q: %v, want a problem naming the key and %q", key, path, err, want)
			}
		}
		for _, path := range []string{"/dev/shm", "/dev/shm/zinf", "/var/tmp/zinf", "/tmp", "/nvme0/zinf", "swap", "/run/user/1000/zinf", "/data/..swap"} {
			if _, err := config.Parse(fmt.Appendf(nil, format, path)); err != nil {
				t.Errorf("%s %q: %v, want it accepted", key, path, err)
			}
		}
	}
}
