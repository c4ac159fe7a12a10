package zinf

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zinfio/zinf/policy"
)

// loop is what the runtime knows of the training loop's walk through the
// layers: the prefetch scheduler that follows its passes, the layers it
// has begun and not ended, the visit whose compute it measures and the
// layer-major visit holding gradients. The loop goroutine alone touches
// it.
type loop struct {
	sched *policy.Scheduler
	held  map[int]*heldLayer // the layer-major visits holding gradients, by layer (two at most: the loop may begin the next layer of a backward pass before it ends the one computing)
	begun map[int]bool       // layers begun and not ended, without GatherLayers
	visit layerVisit         // the layer begun, for the compute measurement
}

// heldLayer is a layer a layer-major visit holds gradients for: a layer
// BeginLayerMicroBatches began for k > 1 micro-batches, and how many of
// each tensor's gradients AccumulateGrad has added since.
type heldLayer struct {
	layer, k int
	count    map[string]int
}

// layerVisit is the layer begun, for the compute measurement: when
// BeginLayer returned, the runtime's I/O wait then, its micro-batches.
type layerVisit struct {
	layer, k int
	start    time.Time
	wait0    int64
}

// begunExcept names the layers begun and not ended, but l ("layers 0,
// 1"), or "" when there are none.
func (lp *loop) begunExcept(l int) string {
	var ls []int
	for b := range lp.begun {
		if b != l {
			ls = append(ls, b)
		}
	}
	if len(ls) == 0 {
		return ""
	}
	slices.Sort(ls)
	s := make([]string, len(ls))
	for i, b := range ls {
		s[i] = strconv.Itoa(b)
	}
	if len(ls) == 1 {
		return "layer " + s[0] + " is"
	}
	return "layers " + strings.Join(s, ", ") + " are"
}
