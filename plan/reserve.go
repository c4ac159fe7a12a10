package plan

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/policy"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/grad"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/tensor"
)

// Reservations is how a zinf.Runtime splits its pinned pool: each consumer gets
// its own region of the arena (see buffers.Options.Reservations), so no
// consumer can wait on memory another holds. Every figure is in pool
// bytes, counted with the pool's block rule (buffers.SpanBytes).
type Reservations struct {
	// ParamDemandBytes holds the largest layer's NVMe parameter
	// partitions while the layer is in use (swapped in on demand).
	ParamDemandBytes int64
	// ParamResidentBytes holds CPU-tier parameter partitions, twice: the
	// current copy and the one a step stages.
	ParamResidentBytes int64
	// ParamStageBytes holds new parameter values on their way to NVMe at a
	// step.
	ParamStageBytes int64
	// PrefetchBytes is the parameter prefetch window (layers fetched ahead
	// of use). It is what is left of the pool beyond every minimum, up to
	// what the prefetch depth wants; 0 at the minimum pool.
	PrefetchBytes int64
	// ParamCacheBytes is offload_param.max_in_cpu as it fits: released
	// partitions kept in pinned memory. It shares the prefetch window's
	// memory and gives it back under pressure.
	ParamCacheBytes int64
	// GradBytes is the gradient write-behind: the gradients kept in pinned
	// memory plus one in flight (grad.PinnedNeedBytes), plus GradExtraBytes.
	GradBytes int64
	// GradExtraBytes is the part of GradBytes beyond its minimum: room for
	// up to GradExtraWriteBehinds more of the largest gradient's
	// write-behinds in flight, so that a gradient handed over does not wait
	// for the write of the one before it (the disk would idle meanwhile).
	// It comes from what the pool has beyond every minimum and the planned
	// prefetch window, at most half of that; 0 at the minimum pool.
	GradExtraBytes int64
	// GradKept names the gradients that stay in pinned memory for the
	// whole run (zinf.pinned_grads auto), in the model's order: the
	// optimizer's update reads them there, so they are never written to
	// NVMe nor read back. They are those the pool has room for beyond
	// every minimum and the planned prefetch window, taken in the
	// model's order (a gradient too large for what is left is passed
	// over); their buffers, GradKeptBytes, are part of GradBytes.
	// GradKeptElems of GradElems gradient elements stay (GradElems counts
	// every gradient that would otherwise go to NVMe); GradKeptNote says,
	// when some do not, why and what pool keeps them all. Empty without
	// a gradient store (gradients then never leave pinned memory anyway).
	GradKept                 []string
	GradKeptBytes            int64
	GradKeptElems, GradElems int64
	GradKeptNote             string
	// GradInFlight is how many of the largest gradient's write-behinds the
	// gradient reservation holds at once beyond the gradients it keeps (1
	// at the minimum; 0 when every gradient stays in pinned memory).
	GradInFlight int
	// OptimizerBytes is the optimizer's step pipeline: sub-group buffers
	// in flight, and the states themselves when they live in pinned memory
	// (optimizer.PinnedNeedBytes), with the deeper pipeline of
	// zinf.pipeline_depth "auto" when it was given room.
	OptimizerBytes int64
	// OptimizerDepth and OptimizerBufferCount are, when zinf.pipeline_depth
	// "auto" deepened the optimizer's pipeline, the depth and buffer sets
	// it took (0: as configured). The deeper pipeline comes out of what
	// the pool has beyond the minimums and the planned prefetch window,
	// at most a sixteenth of the pool (autoPipelinePoolShare): the
	// minimum is the configured depth's. OptimizerDepthWanted is the depth
	// that keeps AutoPipelineBytes in flight, which a pool with less room
	// cuts (halving it until it fits).
	OptimizerDepth, OptimizerBufferCount, OptimizerDepthWanted int
	// StagingBytes is shared staging: device copies and the bounce path of
	// device I/O.
	StagingBytes int64
	// GatherBytes holds the full parameters of two layers (the largest)
	// with zinf.Options.GatherLayers: the layer in use and the next one,
	// gathered from every rank's partitions ahead of use; 0 without.
	GatherBytes int64
	// MinPoolBytes is the smallest zinf.tiers.cpu_pinned_bytes that works:
	// the sum of every minimum above (the prefetch window and the cache
	// are not minimums).
	MinPoolBytes int64
	// LayerMajorPoolBytes is, under zinf.schedule auto with several
	// micro-batches, the pool a layer-major step needs (its gradient
	// reservation holds a layer's sums): with less, auto takes
	// micro-batch-major, whose minimum is MinPoolBytes. 0 otherwise.
	LayerMajorPoolBytes int64
	// PoolBytes is the pool's capacity.
	PoolBytes int64
	// PieceBytes is the piece big tensors move in (zinf.Options.PieceBytes as
	// the stores round it; 0: every tensor moves whole).
	PieceBytes int64
	// What sets the minimums: DemandLayer is the layer whose parameters
	// in use set ParamDemandBytes, DemandTensor its largest (or the
	// streamed tensor whose piece does); StageTensor sets
	// ParamStageBytes, GradTensor the gradient reservation (the longest
	// partition), OptimizerTensor the optimizer's (its largest
	// sub-group).
	DemandLayer                                            int
	DemandTensor, StageTensor, GradTensor, OptimizerTensor string
	// GradHeldLayer is, when a layer-major step's hold of a layer's
	// gradient sums sets GradBytes (several micro-batches), that layer;
	// -1 otherwise.
	GradHeldLayer int
	// GranuleBytes is the pool's allocation granule.
	GranuleBytes int64
}

// ParamsBytes is the parameter swapper's whole region.
func (r Reservations) ParamsBytes() int64 {
	return r.ParamDemandBytes + r.ParamResidentBytes + r.ParamStageBytes + r.PrefetchBytes
}

// rows are the reservations as the placement table shows them on the CPU
// tier.
func (r Reservations) rows() []policy.PinnedRow {
	params := "params: in use + staged"
	if r.PrefetchBytes > 0 {
		params += " + prefetch"
		if r.ParamCacheBytes > 0 {
			params += " (max_in_cpu cache)"
		}
	}
	return []policy.PinnedRow{
		{What: params, Bytes: r.ParamsBytes()},
		{What: gradRow(r), Bytes: r.GradBytes},
		{What: "optimizer: step pipeline", Bytes: r.OptimizerBytes},
		{What: "staging: device copies", Bytes: r.StagingBytes},
		{What: "collectives: gathered layers", Bytes: r.GatherBytes},
	}
}

// gradRow names the gradient reservation in the placement table.
func gradRow(r Reservations) string {
	switch {
	case r.GradKeptBytes == 0:
		return "gradients: write-behind"
	case r.GradKeptElems == r.GradElems:
		return "gradients: kept in pinned memory"
	}
	return "gradients: kept + write-behind"
}

// String lists the reservations, one per line.
func (r Reservations) String() string {
	var sb strings.Builder
	line := func(what string, n int64) {
		fmt.Fprintf(&sb, "  %-38s %s\n", what, config.Size(n))
	}
	line("params: largest layer in use", r.ParamDemandBytes)
	line("params: cpu tier (current + staged)", r.ParamResidentBytes)
	line("params: staged updates to nvme", r.ParamStageBytes)
	line("params: prefetch window (+ max_in_cpu)", r.PrefetchBytes)
	if r.GradKeptBytes > 0 {
		line("gradients: kept in pinned memory", r.GradKeptBytes)
	}
	switch wb := r.GradBytes - r.GradKeptBytes; {
	case r.GradInFlight > 1:
		fmt.Fprintf(&sb, "  %-38s %s (%d in flight)\n", "gradients: write-behind", config.Size(wb), r.GradInFlight)
	case wb > 0 || r.GradKeptBytes == 0:
		line("gradients: write-behind", wb)
	}
	if r.GradKeptNote != "" {
		fmt.Fprintf(&sb, "  %-38s %s\n", "", r.GradKeptNote)
	}
	line("optimizer: step pipeline", r.OptimizerBytes)
	line("staging: device copies, bounce path", r.StagingBytes)
	if r.GatherBytes > 0 {
		line("collectives: gathered layers (2)", r.GatherBytes)
	}
	if r.PieceBytes > 0 {
		fmt.Fprintf(&sb, "  %-38s %s (zinf.piece_bytes: larger tensors move in pieces)\n", "piece", config.Size(r.PieceBytes))
	}
	fmt.Fprintf(&sb, "  %-38s %s (zinf.tiers.cpu_pinned_bytes; this config has %s)\n", "minimum pool", config.Size(r.MinPoolBytes), config.Size(r.PoolBytes))
	if r.LayerMajorPoolBytes > 0 {
		fmt.Fprintf(&sb, "  %-38s %s (zinf.schedule auto: micro-batch-major below it)\n", "layer-major pool", config.Size(r.LayerMajorPoolBytes))
	}
	return sb.String()
}

// PoolTooSmallError says that the pinned pool cannot hold what the model
// needs at the least; zinf.Open returns it before anything is built.
type PoolTooSmallError struct {
	Have, Need int64
	Res        Reservations
}

// ErrPoolTooSmall is wrapped by PoolTooSmallError.
var ErrPoolTooSmall = errors.New("zinf: pinned pool too small")

func (e *PoolTooSmallError) Error() string {
	return fmt.Sprintf("zinf: zinf.tiers.cpu_pinned_bytes = %s is too small for this model: the minimum is %s (%d bytes); %s; or raise zinf.tiers.cpu_pinned_bytes to at least %s. Reservations:\n%s",
		config.Size(e.Have), config.Size(e.Need), e.Need, e.Res.largestNeed(), config.Size(e.Need), e.Res.String())
}

// largestNeed says which reservation weighs most in the minimum, what
// sets it and what would lower it.
func (r Reservations) largestNeed() string {
	piece := "zinf.piece_bytes (zinf.Options.PieceBytes)"
	if r.PieceBytes > 0 {
		piece = fmt.Sprintf("zinf.piece_bytes (zinf.Options.PieceBytes; now %s)", config.Size(r.PieceBytes))
	}
	type need struct {
		bytes int64
		say   string
	}
	needs := []need{
		{r.ParamDemandBytes, fmt.Sprintf("the parameters of layer %d in use (%s), held whole while the layer is begun, set by %q: a tensor larger than %s moves in pieces instead, so lower it below that tensor's size",
			r.DemandLayer, config.Size(r.ParamDemandBytes), r.DemandTensor, piece)},
		{r.ParamResidentBytes, fmt.Sprintf("parameters kept in the pool on the cpu tier, twice (%s): put them on NVMe (zero_optimization.offload_param.device \"nvme\")", config.Size(r.ParamResidentBytes))},
		{r.ParamStageBytes, fmt.Sprintf("a parameter's new values staged on their way to NVMe (%s), set by %q: lower %s below its size, so that it is written in pieces", config.Size(r.ParamStageBytes), r.StageTensor, piece)},
		{r.GradBytes, r.gradNeed(piece)},
		{r.OptimizerBytes, fmt.Sprintf("the optimizer's step pipeline (%s), set by the sub-groups of %q: lower zero_optimization.sub_group_size, offload_optimizer.buffer_count or zinf.pipeline_depth", config.Size(r.OptimizerBytes), r.OptimizerTensor)},
		{r.StagingBytes, fmt.Sprintf("device staging (%s): GPU-tier copies and the GDS bounce path (aio.block_size, zinf.gds)", config.Size(r.StagingBytes))},
		{r.GatherBytes, fmt.Sprintf("two gathered layers (%s, Options.GatherLayers)", config.Size(r.GatherBytes))},
	}
	best := needs[0]
	for _, n := range needs[1:] {
		if n.bytes > best.bytes {
			best = n
		}
	}
	return "the largest part is " + best.say
}

// gradNeed says what sets the gradient reservation and what lowers it.
func (r Reservations) gradNeed(piece string) string {
	if r.GradHeldLayer >= 0 {
		// A smaller piece lowers only the write-behind beside the sums,
		// which are the layer's whole gradients whatever their pieces.
		return fmt.Sprintf("the gradients of layer %d (%s with a piece's write-behind), whose sums over the micro-batches a layer-major step holds in pinned memory: zinf.schedule micro-batch-major (or auto, which takes it below this pool) holds none",
			r.GradHeldLayer, config.Size(r.GradBytes))
	}
	return fmt.Sprintf("the gradient write-behind (%s), set by %q: gradients longer than a piece are written in pieces: lower %s", config.Size(r.GradBytes), r.GradTensor, piece)
}

func (e *PoolTooSmallError) Unwrap() error { return ErrPoolTooSmall }

// GranuleBytes is the pinned pool's granule for cfg: the default size class,
// raised to the swap stores' alignment (their transfers need it).
func GranuleBytes(stores ...*swapper.Store) int64 {
	g := int64(max(buffers.DefaultMinBufferBytes, os.Getpagesize()))
	for _, s := range stores {
		if s != nil && s.Alignment() > g {
			g = s.Alignment()
		}
	}
	return g
}

// sizingGrads stands in for the gradient swapper while the pool that the
// real one needs is being sized: the optimizer asks it only how large a
// sub-group's gradient buffer is.
type sizingGrads struct {
	store      *swapper.Store
	pieceElems int // grad.Options.PieceElems
}

func (g sizingGrads) ReadRange(context.Context, string, int, int, []byte) ([]float32, error) {
	return nil, errors.New("zinf: internal: sizing stand-in read")
}

func (g sizingGrads) RangeBufferBytes(lo, hi int) int {
	if hi <= lo {
		return 0
	}
	if g.store == nil {
		return 4 * (hi - lo)
	}
	if pe := g.pieceElems; pe > 0 {
		base := lo / pe * pe // as grad.Swapper.RangeBufferBytes: ranges lie in one piece
		lo, hi = lo-base, hi-base
	}
	return int(max(g.store.RangeLen(4*int64(lo), 4*int64(hi)), 4*int64(hi-lo)))
}

// reservationInput is what reserve needs of an opening runtime.
type reservationInput struct {
	cfg         *config.Config
	mi          *Index
	rank, world int
	dtype       tensor.DType
	tiers       map[string]tensor.Tier
	paramStore  *swapper.Store
	gradStore   *swapper.Store
	optimStore  *swapper.Store
	prefetch    int // layers the plan would fetch ahead
	bounceBytes int64
	optOpts     optimizer.Options
	inference   bool
	gather      bool // zinf.Options.GatherLayers
	autoDepth   bool // zinf.pipeline_depth "auto": deepen the optimizer's pipeline with spare room
	layerMajor  bool // the plan's schedule holds a layer's gradients in pinned memory
	micro       int  // the plan's micro-batches per step (Placement.MicroBatches)
	pieces      Pieces
}

// reserve computes the reservations for in, giving what the pool has
// beyond the minimums to the prefetch window and the parameter cache.
func reserve(in reservationInput) Reservations {
	granule := GranuleBytes(in.paramStore, in.gradStore, in.optimStore)
	span := func(n int64) int64 { return buffers.SpanBytes(n, int(granule)) }
	r := Reservations{GranuleBytes: granule, PoolBytes: int64(in.cfg.Zinf.Tiers.CPUPinnedBytes)}
	elem := int64(in.dtype.Size())
	part := func(name string) int64 {
		lo, hi := Partition(int(in.mi.Numel[name]), in.rank, in.world)
		return int64(hi - lo)
	}
	padded := func(n int64) int64 {
		if in.paramStore != nil {
			return in.paramStore.PaddedLen(n)
		}
		return n
	}
	var maxNVMe, maxGPU, layerMax, gpuSnap int64
	var streamed string // the largest streamed partition
	var streamedBytes int64
	for l, names := range in.mi.Layers {
		var layer int64
		var largest string
		var largestBytes int64
		for _, n := range names {
			b := part(n) * elem
			if b == 0 {
				continue
			}
			switch in.tiers[n] {
			case tensor.TierNVMe:
				if pb := in.pieces.ParamBytes; pb > 0 && b > pb {
					// Streamed in pieces: never resident whole.
					if b > streamedBytes {
						streamed, streamedBytes = n, b
					}
					continue
				}
				s := span(padded(b))
				layer += s
				if s > maxNVMe {
					maxNVMe, r.StageTensor = s, n
				}
				if s > largestBytes {
					largest, largestBytes = n, s
				}
			case tensor.TierCPU:
				r.ParamResidentBytes += 2 * span(b)
			case tensor.TierGPU:
				maxGPU = max(maxGPU, span(b))
				gpuSnap += span(b)
			}
		}
		if layer > layerMax {
			layerMax = layer
			r.DemandLayer, r.DemandTensor = l, largest
		}
	}
	r.ParamDemandBytes = layerMax
	if streamed != "" {
		// Reads of streamed partitions go one piece at a time.
		piece := span(in.pieces.ParamBytes)
		r.ParamDemandBytes += piece
		if layerMax < piece {
			r.DemandLayer, r.DemandTensor = in.mi.Layer[streamed], streamed
		}
	}
	r.PieceBytes = in.pieces.ParamBytes
	if (maxNVMe > 0 || streamed != "") && !in.inference {
		// New values on their way to NVMe hold a buffer only until their
		// write completes, which needs nothing else: one tensor's worth
		// keeps the step going (more would only overlap more writes); a
		// streamed tensor's, one piece.
		r.ParamStageBytes = maxNVMe
		if streamed != "" && span(in.pieces.ParamBytes) > maxNVMe {
			r.ParamStageBytes, r.StageTensor = span(in.pieces.ParamBytes), streamed
		}
	}
	var parts []int
	var gradBuf int64               // the largest gradient write-behind's buffer
	var optSizing optimizer.Options // the optimizer's options as sized
	for _, d := range in.mi.Descs {
		parts = append(parts, int(part(d.Name)))
	}
	if !in.inference {
		gopts := grad.Options{Store: in.gradStore, PieceElems: in.pieces.GradElems}
		r.GradBytes = grad.PinnedNeedBytes(gopts, parts, span)
		if gradBuf = grad.WriteBufferBytes(gopts, parts, span); gradBuf > 0 {
			r.GradInFlight = 1
		}
		r.GradTensor = largestPart(in.mi, parts)
		// At one micro-batch layer-major holds nothing: each gradient is
		// handed once and written behind as micro-batch-major's is.
		r.GradHeldLayer = -1
		if in.layerMajor && in.gradStore != nil && in.micro > 1 {
			if held, layer := layerGradBytes(in, span); held > r.GradBytes {
				r.GradBytes, r.GradHeldLayer = held, layer
			}
		}
		oo := in.optOpts
		oo.Store = in.optimStore
		oo.Grads = sizingGrads{in.gradStore, in.pieces.GradElems}
		r.OptimizerBytes = optimizer.PinnedNeedBytes(oo, parts, span)
		if in.autoDepth && oo.PipelineDepth > 0 && in.optimStore != nil {
			// Records on NVMe: their reads and writes are what a deeper
			// pipeline overlaps (in pinned memory a step moves none).
			r.OptimizerDepthWanted = optimizer.AutoPipelineDepth(oo, parts, span, AutoPipelineBytes(in.cfg))
		}
		optSizing = oo
		sgMax := oo.SubGroupSize
		if sgMax <= 0 {
			sgMax = optimizer.DefaultSubGroupSize
		}
		bestSG := -1
		for i, n := range parts {
			if g := min(n, sgMax); g > bestSG {
				bestSG, r.OptimizerTensor = g, in.mi.Descs[i].Name
			}
		}
		if in.optimStore == nil {
			// An asynchronous checkpoint pins the committed state records
			// while the next step builds new ones: one more copy of each.
			sg := max(oo.SubGroupSize, 1)
			if sg == 0 || oo.SubGroupSize == 0 {
				sg = optimizer.DefaultSubGroupSize
			}
			for _, n := range parts {
				for off := 0; off < n; off += sg {
					r.OptimizerBytes += span(optimizer.LayoutForArrays(min(sg, n-off), 1+oo.Hyper.StateCount()).Bytes)
				}
			}
		}
	}
	// Device copies stage one partition; an asynchronous checkpoint
	// snapshots every GPU-tier partition into host memory.
	r.StagingBytes = span(maxGPU) + gpuSnap + in.bounceBytes
	if in.bounceBytes > 0 {
		// Partitions swapped into device memory are read back through a
		// staging buffer.
		r.StagingBytes += maxNVMe
	}
	if in.gather {
		r.GatherBytes = GatherSlots * gatherLayerBytes(in.mi, elem, span)
	}
	if !in.inference && in.gradStore != nil {
		for _, n := range parts {
			r.GradElems += int64(n)
		}
		keepGrads(&r, in, parts, span, 0) // the note, while nothing is spare
	}
	r.MinPoolBytes = r.ParamDemandBytes + r.ParamResidentBytes + r.ParamStageBytes + r.GradBytes + r.OptimizerBytes + r.StagingBytes + r.GatherBytes
	if r.PoolBytes > r.MinPoolBytes {
		left := r.PoolBytes - r.MinPoolBytes
		if r.OptimizerDepthWanted > optSizing.PipelineDepth {
			// zinf.pipeline_depth "auto": a deeper optimizer pipeline
			// from what is left beyond the planned prefetch window.
			spare := min(left-int64(max(in.prefetch, 0))*r.ParamDemandBytes, r.PoolBytes/autoPipelinePoolShare)
			for d := r.OptimizerDepthWanted; d > optSizing.PipelineDepth; d = max(optSizing.PipelineDepth, d/2) {
				deep := optSizing
				deep.PipelineDepth, deep.BufferCount = d, max(optSizing.BufferCount, 2*d+1)
				if extra := optimizer.PinnedNeedBytes(deep, parts, span) - r.OptimizerBytes; extra <= spare {
					r.OptimizerBytes += extra
					left -= extra
					r.OptimizerDepth, r.OptimizerBufferCount = d, deep.BufferCount
					break
				}
			}
		}
		if !in.inference && in.gradStore != nil {
			// Gradients kept in pinned memory come first (each saves its
			// write-behind and read-back, 8 bytes per element per step),
			// from what is left beyond the planned prefetch window.
			spare := left - int64(max(in.prefetch, 0))*r.ParamDemandBytes
			keepGrads(&r, in, parts, span, spare)
			if r.GradKeptElems < r.GradElems && r.GradElems > 0 {
				// With every gradient kept, the write-behind's minimum
				// (and a layer-major step's held sums) is not needed:
				// its memory counts as spare for them.
				keepGrads(&r, in, parts, span, spare+r.GradBytes)
				if r.GradKeptElems < r.GradElems {
					keepGrads(&r, in, parts, span, spare)
				}
			}
			left -= r.GradKeptBytes
			if r.GradElems > 0 && r.GradKeptElems == r.GradElems {
				// Nothing is written behind: no write-behind buffer, none
				// in flight.
				left += r.GradBytes
				r.GradBytes, r.GradInFlight, r.GradHeldLayer = 0, 0, -1
				gradBuf = 0
			}
			r.GradBytes += r.GradKeptBytes
		}
		// Beyond the planned prefetch window, up to half of what is left
		// lets more gradient write-behinds be in flight.
		if spare := left - int64(max(in.prefetch, 0))*r.ParamDemandBytes; gradBuf > 0 && spare > 0 {
			n := min(GradExtraWriteBehinds, spare/2/gradBuf)
			r.GradExtraBytes = n * gradBuf
			r.GradBytes += r.GradExtraBytes
			r.GradInFlight += int(n)
			left -= r.GradExtraBytes
		}
		// The rest goes to the parameters: prefetching and the cache.
		r.PrefetchBytes = left
		r.PrefetchBytes -= r.PrefetchBytes % granule
		if maxInCPU := in.cfg.ZeroOptimization.OffloadParam.MaxInCPU * elem; maxInCPU > 0 && in.cfg.ZeroOptimization.OffloadParam.Device == config.OffloadNVMe {
			r.ParamCacheBytes = min(maxInCPU, r.PrefetchBytes)
		}
	}
	return r
}

// keepGrads chooses the gradients that stay in pinned memory
// (Reservations.GradKept) from spare pool bytes: in the model's order,
// each whose buffer (as the gradient swapper takes it: padded to the
// store's alignment, counted in pool blocks) still fits. It sets
// GradKeptNote when some gradients take the NVMe round trip.
func keepGrads(r *Reservations, in reservationInput, parts []int, span func(int64) int64, spare int64) {
	r.GradKept, r.GradKeptBytes, r.GradKeptElems, r.GradKeptNote = nil, 0, 0, ""
	if in.cfg.Zinf.PinnedGrads == config.PinnedGradsOff {
		if r.GradElems > 0 {
			r.GradKeptNote = "zinf.pinned_grads \"off\": every gradient is written to NVMe and read back by the update"
		}
		return
	}
	var all int64
	for i, n := range parts {
		if n <= 0 {
			continue
		}
		b := span(in.gradStore.PaddedLen(4 * int64(n)))
		all += b
		if b <= spare-r.GradKeptBytes {
			r.GradKept = append(r.GradKept, in.mi.Descs[i].Name)
			r.GradKeptBytes += b
			r.GradKeptElems += int64(n)
		}
	}
	if r.GradKeptElems < r.GradElems {
		r.GradKeptNote = fmt.Sprintf("zinf.pinned_grads: %.0f%% of the gradients stay in pinned memory (%s of %s); the rest go to NVMe and back: a pool %s larger keeps them all",
			100*float64(r.GradKeptElems)/float64(r.GradElems), config.Size(r.GradKeptBytes), config.Size(all), config.Size(max(all-max(spare, 0), 0)))
	}
}

// GradExtraWriteBehinds is the most gradient write-behinds in flight that
// the reservations add to the one the minimum holds, when the pool has
// room (Reservations.GradExtraBytes). Measured with zinf bench-scale on
// the development VM's virtio disk: one more took the disk from 83-85% to
// 89-91% busy over a step; a second held it there.
const GradExtraWriteBehinds = 2

// layerGradBytes is the pinned memory a layer-major step's gradients
// need, and the layer that sets it: the largest layer's gradient sums,
// held while its micro-batches are handed over, plus the largest buffer
// one more gradient takes, whose write-behind from the layer before may
// still be in flight. A gradient longer than a piece is held as the
// gradient swapper keeps it, in pieces (each a buffer of its own), and
// its write-behinds take a piece at a time.
func layerGradBytes(in reservationInput, span func(int64) int64) (int64, int) {
	piece := in.pieces.GradElems
	var layerMax, largest int64
	maxLayer := -1
	for l, names := range in.mi.Layers {
		var layer int64
		for _, n := range names {
			lo, hi := Partition(int(in.mi.Numel[n]), in.rank, in.world)
			elems := int64(hi - lo)
			if elems == 0 {
				continue
			}
			buf := func(e int64) int64 { return span(in.gradStore.PaddedLen(4 * e)) }
			if piece > 0 && elems > int64(piece) {
				full, rest := elems/int64(piece), elems%int64(piece)
				layer += full * buf(int64(piece))
				if rest > 0 {
					layer += buf(rest)
				}
				largest = max(largest, buf(int64(piece)))
				continue
			}
			layer += buf(elems)
			largest = max(largest, buf(elems))
		}
		if layer > layerMax {
			layerMax, maxLayer = layer, l
		}
	}
	return layerMax + largest, maxLayer
}

// optimizerInFlight is the number of sub-groups the optimizer's step
// holds at once.
func optimizerInFlight(o optimizer.Options) int {
	o.EnsureDefaults()
	if o.PipelineDepth == 0 {
		return 1
	}
	return min(o.BufferCount, 2*o.PipelineDepth+1)
}

// largestPart is the name of the tensor with the longest partition.
func largestPart(mi *Index, parts []int) string {
	best, name := -1, ""
	for i, n := range parts {
		if n > best {
			best, name = n, mi.Descs[i].Name
		}
	}
	return name
}

// Pieces is how big tensors move (see zinf.Options.PieceBytes): parameter
// partitions larger than ParamBytes are streamed in pieces of ParamBytes;
// gradients longer than GradElems are kept in pieces of GradElems (a
// multiple of the optimizer's sub-group, which is at most a piece). Zero
// fields: whole.
type Pieces struct {
	ParamBytes int64
	GradElems  int
}

// GatherSlots is how many layers' full parameters a rank holds at once
// with zinf.Options.GatherLayers: the layer in use and the next one of the
// pass, gathered ahead while the loop computes. The number is the same
// on every rank (it decides the order of the collectives, which must
// be), so it is fixed rather than sized from a rank's free memory.
const GatherSlots = 2

// gatherLayerBytes is the pool bytes one layer's full parameters take: the
// largest layer's, counted at the pool's block rule.
func gatherLayerBytes(mi *Index, elem int64, span func(int64) int64) int64 {
	var most int64
	for _, names := range mi.Layers {
		var b int64
		for _, n := range names {
			b += span(mi.Numel[n] * elem)
		}
		most = max(most, b)
	}
	return most
}
