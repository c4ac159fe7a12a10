package zinf_test

import (
	"context"
	"strings"
	"testing"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/config"
)

// TestTotalStepsAuto: a scheduler whose total_num_steps is "auto" (as the
// Hugging Face integration writes it) is planned without the run's
// number of steps (a plan does not depend on it), refused by Open
// without Options.TotalSteps with an error naming the key and the
// option, and opened with it.
func TestTotalStepsAuto(t *testing.T) {
	c, _ := testConfig(t)
	c.Scheduler.Type = config.SchedulerWarmupDecayLR
	c.Scheduler.TotalNumStepsAuto = true
	c.Scheduler.WarmupNumSteps = 2
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := oneTensor("w", 1000)
	if _, err := zinf.PlanModel(context.Background(), c, m, zinf.Options{NoBandwidthProbe: true}); err != nil {
		t.Fatalf("PlanModel: %v", err)
	}
	_, err := zinf.Open(c, m, zinf.Options{NoBandwidthProbe: true})
	if err == nil || !strings.Contains(err.Error(), "total_num_steps") || !strings.Contains(err.Error(), "Options.TotalSteps") {
		t.Fatalf("Open without TotalSteps: %v, want an error naming total_num_steps and Options.TotalSteps", err)
	}
	rt, err := zinf.Open(c, m, zinf.Options{NoBandwidthProbe: true, TotalSteps: 10})
	if err != nil {
		t.Fatalf("Open with TotalSteps 10: %v", err)
	}
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
}
