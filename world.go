package zinf

import (
	"context"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/comm"
)

// world is this rank's part in a world of ranks (Options.Comm): the
// goroutine that runs the collectives in order, the layers gathered whole
// with GatherLayers, and the scratch of the gradient reductions. The loop goroutine touches it (dist.go).
type world struct {
	comm          comm.Comm
	cw            *commWorker
	gatherOn      bool
	gather        layerGathers
	ones          []int
	reduceScratch []float32
	reducePending *pendingReduce
}

// commWorker runs a rank's collectives one after another, in the order
// they were issued — every rank issues the same sequence — on a
// goroutine of its own, so that the gather of the next layer overlaps
// the loop's compute.
type commWorker struct {
	c    comm.Comm
	jobs chan *commJob
	done chan struct{}
}

type commJob struct {
	run  func() error
	done chan struct{}
	err  error
}

func newCommWorker(c comm.Comm) *commWorker {
	w := &commWorker{c: c, jobs: make(chan *commJob, 8), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for j := range w.jobs {
			j.err = j.run()
			close(j.done)
		}
	}()
	return w
}

// submit queues run; the worker runs queued jobs in order.
func (w *commWorker) submit(run func() error) *commJob {
	j := &commJob{run: run, done: make(chan struct{})}
	w.jobs <- j
	return j
}

// wait waits for j; ctx ends the wait, not the job (a collective in
// flight ends only with every rank, or with the world's failure).
func (j *commJob) wait(ctx context.Context) error {
	select {
	case <-j.done:
		return j.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stop lets the queued jobs finish and ends the worker.
func (w *commWorker) stop() {
	close(w.jobs)
	<-w.done
}

// gatherSlot is one layer's full parameters, gathered or being gathered.
type gatherSlot struct {
	layer int
	names []string
	bufs  []*buffers.Buffer // full tensor in the param dtype; nil for an empty tensor
	job   *commJob
	held  bool // begun and not ended
	ahead bool // issued before its BeginLayer
}

// layerGathers is the loop's view of the gathered layers (loop goroutine).
type layerGathers struct {
	slots []*gatherSlot
	order []int // the pass order, as Forward, Backward or Pass gave it
	pos   int   // the next position BeginLayer expects in order
	// repeat: the pass after this one is the same (ForwardRepeating), so
	// its last layer gathers the next pass's first ahead.
	repeat bool
}

func (s *gatherSlot) release() {
	for i, b := range s.bufs {
		if b != nil {
			b.Release()
			s.bufs[i] = nil
		}
	}
}

// pendingReduce is a reduce-scatter whose result the gradient swapper
// did not take (a full disk): a retried ReduceGrad accumulates it
// without running the collective again, which the other ranks will not.
type pendingReduce struct {
	name string
	part []float32
}
