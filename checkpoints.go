package zinf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/buffers"
	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/schedule"
	"github.com/zinfio/zinf/swapper"
	"github.com/zinfio/zinf/swapper/optimizer"
	"github.com/zinfio/zinf/swapper/param"
)

// Names of a training checkpoint's files and metadata keys. Every rank
// directory holds the two files; keys starting with "zinf." in
// CheckpointMeta.User are reserved for these.
const (
	// CheckpointParamsFile holds the rank's parameter partitions in the
	// parameter dtype, each named by its parameter.
	CheckpointParamsFile = "params.safetensors"
	// CheckpointOptimizerFile holds the rank's optimizer partitions:
	// "<param>.master" and one per state of the optimizer's rule (Adam:
	// "<param>.exp_avg" and "<param>.exp_avg_sq"; see stateSuffixes), in
	// fp32, or as stored when zinf.optimizer_states is bf16 or 8bit (see
	// metaOptimizerStates).
	CheckpointOptimizerFile = "optimizer.safetensors"

	// metaKind marks a checkpoint written by CheckpointState (state-wide).
	metaKind = "zinf.kind"
	// kindTraining is its value (a version: a layout change bumps it).
	kindTraining = "training/1"
	// metaOptimizerStep is Adam's step count (state-wide).
	metaOptimizerStep = "zinf.optimizer_step"
	// metaParamDType is the parameter dtype (state-wide, for people).
	metaParamDType = "zinf.param_dtype"
	// metaPartitions is, per rank, a JSON object mapping each parameter to
	// [lo, hi, numel]: the rank's element range of the flattened tensor.
	metaPartitions = "zinf.partitions"
	// metaTrainState is the step state beyond the optimizer's (state-wide,
	// JSON trainState): the fp16 loss scaler and a learning rate fixed by
	// SetLR. Absent in checkpoints written before it existed: a loaded run
	// then starts the loss scaler afresh.
	metaTrainState = "zinf.train_state"
)

// trainState is what metaTrainState holds.
type trainState struct {
	LossScaler schedule.ScalerState `json:"loss_scaler"`
	LR         *float64             `json:"lr,omitempty"`
}

func (r *Runtime) trainState() trainState {
	st := trainState{LR: r.train.lr}
	if r.train.scaler != nil {
		st.LossScaler = r.train.scaler.State()
	}
	return st
}

// CheckpointMeta is what a training checkpoint records besides the
// tensors (SaveCheckpoint) and what LoadCheckpoint reports back.
type CheckpointMeta struct {
	// Step is the training step the checkpoint follows (the number of
	// steps done); it orders checkpoints for checkpoint.Latest and
	// SaveOptions.KeepLast, and is where a resumed loop continues. It is
	// independent of the optimizer's step count, which is always saved.
	Step int64
	// ModelShape is each parameter's full (unpartitioned) shape. Default:
	// {name: {numel}}. When given it must list exactly the registered
	// parameters, each with as many elements as registered.
	ModelShape map[string][]int64
	// User is free-form metadata; keys starting with "zinf." are reserved.
	User map[string]string
}

// CheckpointState describes the runtimes rts, one per rank of a
// data-parallel job simulated in one process (rts[i].Rank == i, all with
// world size len(rts) and the same registered parameters), as a
// checkpoint.State for checkpoint.Save, a checkpoint.Writer (which keeps
// its engine and pinned memory between saves) or checkpoint.Saver's
// SaveAsync. SaveCheckpoint and SaveCheckpointAsync are the short forms.
//
// Each rank directory gets two files: CheckpointParamsFile with the rank's
// partition of every parameter in the parameter dtype, named by the
// parameter, and CheckpointOptimizerFile with its fp32 master and the
// optimizer's states, named "<param>.master" and "<param>.<state>" (Adam:
// "<param>.exp_avg" and "<param>.exp_avg_sq"; SGD with momentum:
// ".momentum_buffer"; Adagrad: ".sum"; Lion: ".exp_avg"). Partitions are 1-D tensors;
// their element ranges [lo, hi) of the flattened full tensors are in each
// rank's metadata, the optimizer's step count, the parameter dtype, the
// config (as JSON) and the step state beyond the optimizer's (the fp16
// loss scaler and a rate fixed by SetLR; LoadCheckpoint restores them, so
// a resumed run scales, skips and schedules as the uninterrupted one) in
// the checkpoint's.
//
// The tensors are read when the state is saved, not here: call it and
// save between optimizer steps, and do not step the runtimes until
// checkpoint.Save returns (or SaveAsync has returned: it takes its
// snapshot before); close them only once the save has finished
// (Handle.Wait). Nothing is pinned until the state is saved, so a State
// may be built and dropped freely. Every tensor streams through pinned
// memory, never the Go heap, and checkpoint.Saver pins them all instead of
// copying them, so an asynchronous save holds training for next to
// nothing:
//
//   - what lives in the swap stores (parameters on NVMe, and the
//     optimizer's sub-group records when offload_optimizer is nvme):
//     the stores' copy-on-write versions are pinned (swapper.Store.Pin);
//   - CPU-tier parameters and optimizer states kept in pinned memory
//     (offload_optimizer cpu) are checkpoint.FromPinned tensors over
//     copy-on-write snapshots (param.Swapper.Snapshot,
//     optimizer.Optimizer.SnapshotStates): their buffers are held, and
//     training's later commits and steps build new values in other
//     buffers. While a save holds them they cost pinned memory from the
//     runtime's pool twice over for what training has replaced meanwhile:
//     a step that needs a fresh record while the pool is full waits for
//     the save to drain (give zinf.tiers.cpu_pinned_bytes headroom of
//     12 bytes per optimizer element to never wait);
//   - GPU-tier parameters are copied to pinned host buffers when the save
//     pins them (they are small in the simulated models).
//
// For a job whose ranks are processes, SaveCheckpointShared saves each
// rank's part.
func CheckpointState(rts []*Runtime, meta CheckpointMeta) (checkpoint.State, error) {
	return checkpointState(rts, meta, false)
}

// checkpointState is CheckpointState; shared: rts is one rank of a job
// whose ranks are processes, and the State holds it only
// (State.WorldSize is the job's).
func checkpointState(rts []*Runtime, meta CheckpointMeta, shared bool) (checkpoint.State, error) {
	names, numel, err := checkRanks(rts, shared)
	if err != nil {
		return checkpoint.State{}, err
	}
	for _, rt := range rts {
		// A step Step returned from is in the checkpoint: its update (with
		// zinf.overlap_update) is waited for; it always ends.
		if err := rt.settled(context.Background()); err != nil {
			return checkpoint.State{}, err
		}
	}
	shape, err := modelShape(meta.ModelShape, names, numel)
	if err != nil {
		return checkpoint.State{}, err
	}
	var cfg []byte
	if rts[0].Config != nil {
		if cfg, err = rts[0].Config.MarshalJSON(); err != nil {
			return checkpoint.State{}, fmt.Errorf("zinf: checkpoint: encoding the config: %w", err)
		}
	}
	user := make(map[string]string, len(meta.User)+3)
	for k, v := range meta.User {
		if isReserved(k) {
			return checkpoint.State{}, fmt.Errorf("zinf: checkpoint: user metadata key %q: keys starting with \"zinf.\" are reserved", k)
		}
		user[k] = v
	}
	step := rts[0].Optimizer.StepCount()
	for _, rt := range rts[1:] {
		if s := rt.Optimizer.StepCount(); s != step {
			return checkpoint.State{}, fmt.Errorf("zinf: checkpoint: rank %d has done %d optimizer steps, rank 0 %d: save between steps, after every rank stepped", rt.Rank, s, step)
		}
	}
	ts := rts[0].trainState()
	for _, rt := range rts[1:] {
		if o := rt.trainState(); o.LossScaler != ts.LossScaler {
			return checkpoint.State{}, fmt.Errorf("zinf: checkpoint: rank %d's loss scaler %+v differs from rank 0's %+v: save between steps, after every rank stepped", rt.Rank, o.LossScaler, ts.LossScaler)
		}
	}
	tsJSON, err := json.Marshal(ts)
	if err != nil {
		return checkpoint.State{}, fmt.Errorf("zinf: checkpoint: encoding the training state: %w", err)
	}
	user[metaKind] = kindTraining
	user[metaOptimizerStep] = strconv.Itoa(step)
	user[metaTrainState] = string(tsJSON)
	user[metaParamDType] = rts[0].DType.String()
	if f := stateFormatOf(rts[0]); f.Encoding != optimizer.EncodingFP32 {
		user[metaOptimizerStates] = f.String()
	}
	st := checkpoint.State{Step: meta.Step, Config: cfg, ModelShape: shape, User: user}
	if shared {
		st.WorldSize = rts[0].World
	}
	for _, rt := range rts {
		rs, err := rankState(rt, names, numel)
		if err != nil {
			return checkpoint.State{}, err
		}
		st.Ranks = append(st.Ranks, rs)
	}
	return st, nil
}

// SaveCheckpoint saves the runtimes' parameters and optimizer states as
// the checkpoint dir (see CheckpointState for the layout and
// checkpoint.Save for the commit): when it returns without error, the
// checkpoint is complete and durable. Call it between optimizer steps.
func SaveCheckpoint(ctx context.Context, dir string, rts []*Runtime, meta CheckpointMeta, opts checkpoint.SaveOptions) (*checkpoint.Manifest, error) {
	st, err := CheckpointState(rts, meta)
	if err != nil {
		return nil, err
	}
	return checkpoint.Save(ctx, dir, st, opts)
}

// SaveCheckpointShared is SaveCheckpoint for a job whose ranks are
// processes: every rank calls it with its own runtime (which has an
// Options.Comm), and the ranks save together into dir, on a filesystem
// every rank sees (checkpoint.Writer.SaveShared, run on the runtime's
// collective goroutine after the collectives it queued): the checkpoint
// is the same as SaveCheckpoint of every rank in one process would make,
// and every rank returns the same outcome.
func SaveCheckpointShared(ctx context.Context, dir string, rt *Runtime, meta CheckpointMeta, opts checkpoint.SaveOptions) (*checkpoint.Manifest, error) {
	if rt == nil || rt.comm == nil {
		return nil, errors.New("zinf: checkpoint: SaveCheckpointShared needs the rank's runtime, opened with Options.Comm")
	}
	st, err := checkpointState([]*Runtime{rt}, meta, true)
	if err != nil {
		// The other ranks are about to save: they must not wait.
		rt.comm.Abort(fmt.Errorf("rank %d: checkpoint %s: %w", rt.Rank, dir, err))
		return nil, err
	}
	rt.drainComm()
	var m *checkpoint.Manifest
	err = rt.Collective(ctx, func(c comm.Comm) error {
		w := checkpoint.NewWriter()
		defer w.Close()
		var err error
		m, err = w.SaveShared(ctx, dir, st, opts, c)
		return err
	})
	return m, err
}

// SaveCheckpointAsync is SaveCheckpoint through s: it returns once s has
// taken a consistent snapshot of every rank (pinning store versions and
// copy-on-write buffers rather than copying, see CheckpointState and
// checkpoint.Saver), so training may step again at once; the snapshot
// drains to disk in the background and Handle.Wait reports the commit.
// Close the runtimes only after Handle.Wait.
func SaveCheckpointAsync(ctx context.Context, s *checkpoint.Saver, dir string, rts []*Runtime, meta CheckpointMeta, opts checkpoint.SaveOptions) (*checkpoint.Handle, error) {
	st, err := CheckpointState(rts, meta)
	if err != nil {
		return nil, err
	}
	return s.SaveAsync(ctx, dir, st, opts)
}

// registered returns the runtime's parameter names in registration order
// and their full element counts.
func (r *Runtime) registered() ([]string, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.params), maps.Clone(r.numel)
}

// errSharedAsync refuses asynchronous saves of a job whose ranks are
// processes.
var errSharedAsync = errors.New("zinf: checkpoint: asynchronous saves of a job whose ranks are processes (Options.Comm) are not supported: save synchronously")

// checkRanks checks that rts are the ranks 0..len-1 of one job with the
// same parameters (or, with partial, some of its ranks, in rank order)
// and returns them.
func checkRanks(rts []*Runtime, partial bool) ([]string, map[string]int, error) {
	if len(rts) == 0 {
		return nil, nil, errors.New("zinf: checkpoint: no runtimes")
	}
	var names []string
	var numel map[string]int
	for i, rt := range rts {
		if rt == nil {
			return nil, nil, fmt.Errorf("zinf: checkpoint: runtime %d is nil", i)
		}
		if rt.closedErr("checkpoint", nil) != nil {
			return nil, nil, fmt.Errorf("zinf: checkpoint: the runtime of rank %d is closed: %w", i, ErrClosed)
		}
		switch {
		case partial && (rt.World != rts[0].World || (i > 0 && rt.Rank <= rts[i-1].Rank)):
			return nil, nil, fmt.Errorf("zinf: checkpoint: runtime %d is rank %d of %d; pass ranks of one job, in rank order", i, rt.Rank, rt.World)
		case !partial && (rt.Rank != i || rt.World != len(rts)):
			return nil, nil, fmt.Errorf("zinf: checkpoint: runtime %d is rank %d of %d; pass every rank of the job, in rank order (%d runtimes)", i, rt.Rank, rt.World, len(rts))
		}
		if rt.DType != rts[0].DType {
			return nil, nil, fmt.Errorf("zinf: checkpoint: rank %d has parameter dtype %s, rank 0 %s", i, rt.DType, rts[0].DType)
		}
		n, m := rt.registered()
		if i == 0 {
			names, numel = n, m
			continue
		}
		if !slices.Equal(n, names) {
			return nil, nil, fmt.Errorf("zinf: checkpoint: rank %d registered parameters %q, rank 0 %q", i, n, names)
		}
		for _, name := range names {
			if m[name] != numel[name] {
				return nil, nil, fmt.Errorf("zinf: checkpoint: parameter %q has %d elements on rank %d, %d on rank 0", name, m[name], i, numel[name])
			}
		}
	}
	if len(names) == 0 {
		return nil, nil, errors.New("zinf: checkpoint: no parameters registered")
	}
	return names, numel, nil
}

// modelShape returns given, checked against the registered parameters, or
// the flat default.
func modelShape(given map[string][]int64, names []string, numel map[string]int) (map[string][]int64, error) {
	if given == nil {
		out := make(map[string][]int64, len(names))
		for _, n := range names {
			out[n] = []int64{int64(numel[n])}
		}
		return out, nil
	}
	for _, n := range sortedNames(given) {
		if _, ok := numel[n]; !ok {
			return nil, &checkpoint.Error{Op: "save", Tensor: n, Err: fmt.Errorf("%w: CheckpointMeta.ModelShape has parameter %q (shape %v), the runtime did not register it", checkpoint.ErrShape, n, given[n])}
		}
	}
	for _, n := range names {
		s, ok := given[n]
		if !ok {
			return nil, &checkpoint.Error{Op: "save", Tensor: n, Err: fmt.Errorf("%w: CheckpointMeta.ModelShape lacks registered parameter %q", checkpoint.ErrShape, n)}
		}
		if e := shapeElems(s); e != int64(numel[n]) {
			return nil, &checkpoint.Error{Op: "save", Tensor: n, Err: fmt.Errorf("%w: CheckpointMeta.ModelShape gives %q shape %v (%d elements), the runtime registered %d", checkpoint.ErrShape, n, s, e, numel[n])}
		}
	}
	return given, nil
}

// shapeElems is the product of shape (-1 for a negative dimension).
func shapeElems(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return -1
		}
		n *= d
	}
	return n
}

func isReserved(k string) bool { return len(k) >= 5 && k[:5] == "zinf." }

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// rankState builds one rank's files with lazy sources.
func rankState(rt *Runtime, names []string, numel map[string]int) (checkpoint.RankState, error) {
	parts := make(map[string][3]int, len(names))
	params := checkpoint.TensorFile{Name: CheckpointParamsFile}
	optim := checkpoint.TensorFile{Name: CheckpointOptimizerFile}
	for _, name := range names {
		lo, hi, err := rt.Params.PartitionRange(name)
		if err != nil {
			return checkpoint.RankState{}, fmt.Errorf("zinf: checkpoint: rank %d: %w", rt.Rank, err)
		}
		parts[name] = [3]int{lo, hi, numel[name]}
		n := hi - lo
		if n == 0 {
			continue // nothing of it on this rank
		}
		params.Tensors = append(params.Tensors, paramTensor(rt, name, n))
		if f := tensorFormat(rt, name); f.Encoding != optimizer.EncodingFP32 {
			optim.Tensors = append(optim.Tensors, encodedStates(rt, name, n, f)...)
			continue
		}
		if ts, ok := storedStates(rt, name, n); ok {
			optim.Tensors = append(optim.Tensors, ts...)
			continue
		}
		if rt.OptimStore == nil {
			optim.Tensors = append(optim.Tensors, pinnedStates(rt, name, n)...)
			continue
		}
		src := &stateSource{rt: rt, name: name}
		for k, suffix := range stateSuffixes(rt) {
			k := k
			optim.Tensors = append(optim.Tensors, checkpoint.FromFunc(name+suffix, swapper.Float32, []int64{int64(n)}, 4*int64(n),
				func(ctx context.Context, dst []byte, off int64) error { return src.readState(ctx, k, dst, off) }))
		}
	}
	pj, err := json.Marshal(parts)
	if err != nil {
		return checkpoint.RankState{}, err
	}
	return checkpoint.RankState{Rank: rt.Rank, Files: []checkpoint.TensorFile{params, optim},
		User: map[string]string{metaPartitions: string(pj)}}, nil
}

// paramTensor is a rank's partition of name (n elements) in the param
// dtype: straight from the param store when it lives on NVMe (the store
// holds the committed version, in the dtype), else from the swapper's
// copy-on-write snapshot of it (param.Swapper.Snapshot: a CPU-tier
// partition's pinned buffer is held, not copied; a GPU-tier one is copied
// to the host when the save pins it).
func paramTensor(rt *Runtime, name string, n int) checkpoint.Tensor {
	dt := rt.DType
	size := int64(n * dt.Size())
	if st := rt.ParamStore; st != nil {
		key := rt.Params.StoreKey(name)
		if l, ok := st.Len(key); ok && l == size {
			t := checkpoint.FromStore(st, key, dt, []int64{int64(n)})
			t.Name = name
			return t
		}
	}
	return checkpoint.FromPinned(name, dt, []int64{int64(n)}, size, func(ctx context.Context) ([][]byte, func(), error) {
		snap, err := rt.Params.Snapshot(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		b, _ := snap.Bytes(name)
		return [][]byte{b}, snap.Release, nil
	})
}

// pinnedStates returns the three optimizer tensors of name (a partition of
// n elements) when the states are kept in pinned memory, sourced from the
// optimizer's copy-on-write snapshots (Optimizer.SnapshotStates: the
// sub-groups' records are held, not copied, and later steps build new
// records elsewhere), so SaveAsync pins them instead of copying.
func pinnedStates(rt *Runtime, name string, n int) []checkpoint.Tensor {
	suffixes := stateSuffixes(rt)
	out := make([]checkpoint.Tensor, len(suffixes))
	for k, suffix := range suffixes {
		kind := optimizer.StateKind(k)
		out[k] = checkpoint.FromPinned(name+suffix, swapper.Float32, []int64{int64(n)}, 4*int64(n), func(context.Context) ([][]byte, func(), error) {
			snap, err := rt.Optimizer.SnapshotStates(name)
			if err != nil {
				return nil, nil, err
			}
			segs, _ := snap.Segments(name, kind)
			return segs, snap.Release, nil
		})
	}
	return out
}

// storedStates returns the three optimizer tensors of name (a partition
// of n elements) as ranges of the optimizer's sub-group records in its store
// (optimizer.StateRecords: each record holds the master and the rule's
// states in fp32 where its Layout says), so that they stream from the
// store like the parameters and SaveAsync pins them instead of copying. ok is false when the states are in
// memory (pinnedStates serves them) or the records are not as expected
// (then ReadState does).
func storedStates(rt *Runtime, name string, n int) ([]checkpoint.Tensor, bool) {
	st := rt.OptimStore
	if st == nil {
		return nil, false
	}
	recs, ok := rt.Optimizer.StateRecords(name)
	if !ok {
		return nil, false
	}
	suffixes := stateSuffixes(rt)
	w := int64(len(suffixes))
	ranges := make([][]checkpoint.StoreRange, w)
	total := 0
	for _, r := range recs {
		m := int64(r.Elems)
		if l, ok := st.Len(r.Key); !ok || l != r.Layout.Bytes || r.Layout.Arrays != int(w) {
			return nil, false
		}
		for k := range ranges {
			ranges[k] = append(ranges[k], checkpoint.StoreRange{Name: r.Key, Off: r.Layout.Offsets[k], Len: 4 * m})
		}
		total += r.Elems
	}
	if total != n {
		return nil, false
	}
	out := make([]checkpoint.Tensor, w)
	for k, suffix := range suffixes {
		out[k] = checkpoint.FromStoreRanges(st, name+suffix, swapper.Float32, []int64{int64(n)}, ranges[k])
	}
	return out, true
}

// stateSource serves a parameter's three optimizer partitions from one
// ReadState, dropping each once it has been read to its end: the fallback
// for store records not laid out as storedStates expects.
type stateSource struct {
	rt   *Runtime
	name string
	mu   sync.Mutex
	have [][]float32 // master, then the rule's states
}

func (s *stateSource) readState(ctx context.Context, k int, dst []byte, off int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.have == nil || s.have[k] == nil {
		m, st, err := s.rt.Optimizer.ReadStates(ctx, s.name)
		if err != nil {
			return err
		}
		s.have = append([][]float32{m}, st...)
	}
	b := buffers.AsBytes(s.have[k])
	copy(dst, b[off:])
	if off+int64(len(dst)) == int64(len(b)) {
		s.have[k] = nil // read to its end: the Go heap gets it back
	}
	return nil
}

// LoadCheckpoint restores the training checkpoint dir (written by
// SaveCheckpoint or SaveCheckpointAsync) into rts, every rank of a job in
// rank order, whose parameters are already registered (RegisterParam, with
// any initial values): the same names with the same element counts as the
// checkpoint's. The world size may differ from the checkpoint's: each
// parameter and optimizer state is rebuilt whole from the saved ranks'
// partitions and each rank given its Partition of it (re-partitioning).
// Parameters are staged and committed at once (Params.StageUpdate,
// CommitUpdates); optimizer states are loaded with the saved step count
// (Optimizer.LoadState). It returns the checkpoint's metadata; Step is
// where training resumes. Call it between steps, with no gradient
// accumulated.
//
// Before anything is changed, every rank's structure is checked: the
// checkpoint kind, the parameter dtype (it must be the runtimes'), the
// parameter names and element counts both ways, each tensor's dtype and
// size and that the saved partitions cover each tensor exactly. A
// mismatch returns an error naming the parameter (wrapping
// checkpoint.ErrShape for a different model) and leaves the runtimes as
// they were. Each tensor's CRC-32C is checked as it is read; a corrupt
// parameter partition also leaves the runtimes untouched (its staged
// updates are discarded), but a corrupt optimizer partition is found after
// earlier parameters' optimizer states were loaded: the error names it
// and the runtimes must be loaded again (checkpoint.Verify first makes
// sure of the whole checkpoint).
//
// Memory: one parameter at a time, its full tensor is held in the Go heap
// as fp32, four times (the parameter and the three optimizer states),
// plus the checkpoint reader's pinned bounce buffers. That is a few MB for
// the simulated models, and what re-partitioning from partitions needs
// without ranged writes into the swappers.
//
// In a job whose ranks are processes, every rank loads its own runtime
// (rts of one): each reads the saved partitions it needs from dir, on a
// filesystem every rank sees.
func LoadCheckpoint(ctx context.Context, dir string, rts []*Runtime) (CheckpointMeta, error) {
	names, numel, err := checkRanks(rts, true)
	if err != nil {
		return CheckpointMeta{}, err
	}
	log := rts[0].log
	if log == nil {
		log = slog.Default()
	}
	for _, rt := range rts {
		if err := rt.settled(ctx); err != nil {
			return CheckpointMeta{}, err
		}
		rt.drainComm() // no gather ahead reads the parameters while they change
	}
	ranks, err := checkpoint.ListRanks(dir)
	if err != nil {
		return CheckpointMeta{}, err
	}
	eng, err := aio.New(aio.Options{Backend: aio.BackendAuto, Direct: aio.DirectOptional, IntraOpParallelism: 2, Logger: log})
	if err != nil {
		return CheckpointMeta{}, fmt.Errorf("zinf: checkpoint: creating the I/O engine: %w", err)
	}
	defer eng.Close()
	saved := make([]savedRank, len(ranks))
	defer func() {
		for _, s := range saved {
			if s.r != nil {
				s.r.Close()
			}
		}
	}()
	for i, ri := range ranks {
		r, err := checkpoint.OpenWith(dir, ri.Rank, checkpoint.ReadOptions{Engine: eng, Logger: log})
		if err != nil {
			return CheckpointMeta{}, err
		}
		saved[i].r = r
	}
	meta0 := saved[0].r.Meta()
	if meta0.User[metaKind] != kindTraining {
		return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: not a zinf training checkpoint (metadata %s is %q, want %q): written by checkpoint.Save directly?",
			checkpoint.ErrNotCheckpoint, metaKind, meta0.User[metaKind], kindTraining)}
	}
	optStep, err := strconv.Atoi(meta0.User[metaOptimizerStep])
	if err != nil || optStep < 0 {
		return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: metadata %s = %q is not a step count", checkpoint.ErrCorrupt, metaOptimizerStep, meta0.User[metaOptimizerStep])}
	}
	var ts *trainState
	if raw, ok := meta0.User[metaTrainState]; ok {
		ts = new(trainState)
		if len(raw) > 1<<16 {
			return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: metadata %s is %d bytes long", checkpoint.ErrCorrupt, metaTrainState, len(raw))}
		}
		if err := json.Unmarshal([]byte(raw), ts); err != nil {
			return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: metadata %s: %v", checkpoint.ErrCorrupt, metaTrainState, err)}
		}
		if rts[0].train.scaler != nil && rts[0].train.scaler.Dynamic() {
			// Checked now, so that a bad state changes nothing.
			probe, _ := schedule.NewLossScalerFromConfig(rts[0].Config)
			if probe != nil {
				if err := probe.Restore(ts.LossScaler); err != nil {
					return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: metadata %s: %v", checkpoint.ErrCorrupt, metaTrainState, err)}
				}
			}
		}
		if ts.LR != nil && (!(*ts.LR >= 0) || math.IsInf(*ts.LR, 0)) {
			return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: metadata %s: learning rate %v", checkpoint.ErrCorrupt, metaTrainState, *ts.LR)}
		}
	}
	dt := rts[0].DType
	suffixes := stateSuffixes(rts[0])
	if w, ok := meta0.User[metaOptimizerStates]; ok {
		if f, err := optimizer.ParseStateFormat(w); err != nil || f == optimizer.FormatFP32 {
			return CheckpointMeta{}, &checkpoint.Error{Op: "load", Path: dir, Err: fmt.Errorf("%w: metadata %s = %q: allowed: bf16, 8bit", checkpoint.ErrCorrupt, metaOptimizerStates, w)}
		}
	}
	for i := range saved {
		if err := checkSavedRank(&saved[i], names, numel, dt, suffixes); err != nil {
			return CheckpointMeta{}, err
		}
	}
	for _, n := range names {
		if err := checkCoverage(dir, saved, n, numel[n]); err != nil {
			return CheckpointMeta{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return CheckpointMeta{}, err
	}

	// Parameters: staged on every rank, committed only once all are read.
	committed := false
	defer func() {
		if !committed {
			for _, rt := range rts {
				rt.Params.DiscardUpdates()
			}
		}
	}()
	var waiters []param.Waiter
	for _, n := range names {
		full := make([]float32, numel[n])
		var scratch []byte
		for _, s := range saved {
			p := s.parts[n]
			if p[1] == p[0] {
				continue
			}
			if dt == swapper.Float32 {
				if err := s.r.ReadTensor(ctx, n, buffers.AsBytes(full[p[0]:p[1]])); err != nil {
					return CheckpointMeta{}, err
				}
				continue
			}
			need := (p[1] - p[0]) * dt.Size()
			if cap(scratch) < need {
				scratch = make([]byte, need)
			}
			if err := s.r.ReadTensor(ctx, n, scratch[:need]); err != nil {
				return CheckpointMeta{}, err
			}
			buffers.Decode(dt, full[p[0]:p[1]], scratch[:need])
		}
		for _, rt := range rts {
			lo, hi := rt.Partition(n)
			w, err := rt.Params.StageUpdate(ctx, n, full[lo:hi])
			if err != nil {
				return CheckpointMeta{}, fmt.Errorf("zinf: checkpoint: rank %d: staging %q: %w", rt.Rank, n, err)
			}
			waiters = append(waiters, w)
		}
	}
	for _, w := range waiters {
		if err := w.Wait(); err != nil {
			return CheckpointMeta{}, fmt.Errorf("zinf: checkpoint: staging the parameters: %w", err)
		}
	}
	// Optimizer states, one parameter at a time.
	logged := false
	for _, n := range names {
		if compressedAnywhere(saved, rts, n) {
			if err := loadTensorStates(ctx, log, saved, rts, n, numel[n], suffixes, optStep, &logged); err != nil {
				return CheckpointMeta{}, err
			}
			continue
		}
		st := make([][]float32, len(suffixes))
		for k, suffix := range suffixes {
			st[k] = make([]float32, numel[n])
			for _, s := range saved {
				p := s.parts[n]
				if p[1] == p[0] {
					continue
				}
				if err := s.r.ReadTensor(ctx, n+suffix, buffers.AsBytes(st[k][p[0]:p[1]])); err != nil {
					return CheckpointMeta{}, err
				}
			}
		}
		for _, rt := range rts {
			lo, hi := rt.Partition(n)
			states := make([][]float32, len(st)-1)
			for k := range states {
				states[k] = st[k+1][lo:hi]
			}
			if err := rt.Optimizer.LoadStates(ctx, n, st[0][lo:hi], states, optStep); err != nil {
				return CheckpointMeta{}, fmt.Errorf("zinf: checkpoint: rank %d: %w", rt.Rank, err)
			}
		}
	}
	for _, rt := range rts {
		if err := rt.Params.CommitUpdates(); err != nil {
			return CheckpointMeta{}, fmt.Errorf("zinf: checkpoint: rank %d: committing the parameters: %w", rt.Rank, err)
		}
	}
	committed = true
	for _, rt := range rts {
		rt.restoreTrainState(ts)
	}
	out := CheckpointMeta{Step: meta0.Step, ModelShape: meta0.ModelShape, User: map[string]string{}}
	for k, v := range meta0.User {
		if !isReserved(k) {
			out.User[k] = v
		}
	}
	return out, nil
}

// restoreTrainState sets the loss scaler and SetLR's rate from a
// checkpoint (checked already); nil (an older checkpoint) starts the
// scaler afresh. A dynamic scale is restored only into a dynamic scaler:
// a run resumed with another fp16 setting keeps its own.
func (r *Runtime) restoreTrainState(ts *trainState) {
	t := &r.train
	t.pending = nil
	t.history = nil
	r.bgErr = nil // a step that failed after Step returned is replaced too
	if ts == nil {
		return
	}
	t.lr = ts.LR
	if t.scaler != nil && t.scaler.Dynamic() {
		_ = t.scaler.Restore(ts.LossScaler)
		r.mu.Lock()
		r.trainStats.LossScale = t.scaler.Scale()
		r.mu.Unlock()
	}
}

// checkSavedRank parses a saved rank's partitions and checks its tensors
// against the runtimes' parameters (names and element counts both ways,
// dtypes, sizes).
func checkSavedRank(s *savedRank, names []string, numel map[string]int, dt swapper.DType, suffixes []string) error {
	m := s.r.Meta()
	fail := func(tensor string, err error) error {
		return &checkpoint.Error{Op: "load", Path: m.RankDir, Tensor: tensor, Err: err}
	}
	if err := json.Unmarshal([]byte(m.User[metaPartitions]), &s.parts); err != nil {
		return fail("", fmt.Errorf("%w: metadata %s of rank %d: %v", checkpoint.ErrCorrupt, metaPartitions, m.Rank, err))
	}
	for _, n := range names {
		p, ok := s.parts[n]
		if !ok {
			return fail(n, fmt.Errorf("%w: the runtime has parameter %q (%d elements), the checkpoint does not", checkpoint.ErrShape, n, numel[n]))
		}
		if p[2] != numel[n] {
			return fail(n, fmt.Errorf("%w: parameter %q has %d elements in the checkpoint, %d in the runtime", checkpoint.ErrShape, n, p[2], numel[n]))
		}
		if sh, ok := m.ModelShape[n]; ok && shapeElems(sh) != int64(numel[n]) {
			return fail(n, fmt.Errorf("%w: the checkpoint's model shape of %q is %v, the runtime has %d elements", checkpoint.ErrShape, n, sh, numel[n]))
		}
	}
	for _, n := range sortedNames(s.parts) {
		if _, ok := numel[n]; !ok {
			return fail(n, fmt.Errorf("%w: the checkpoint has parameter %q (%d elements), the runtime did not register it", checkpoint.ErrShape, n, s.parts[n][2]))
		}
	}
	for _, n := range names {
		p := s.parts[n]
		if p[0] < 0 || p[0] > p[1] || p[1] > p[2] {
			return fail(n, fmt.Errorf("%w: rank %d partition [%d, %d) of %d elements", checkpoint.ErrCorrupt, m.Rank, p[0], p[1], p[2]))
		}
		elems := int64(p[1] - p[0])
		if elems == 0 {
			continue
		}
		if s.formats == nil {
			s.formats = map[string]optimizer.StateFormat{}
		}
		f := savedFormat(s.r, n, suffixes)
		s.formats[n] = f
		want := append([]savedTensor{{n, dt, elems}}, savedStateTensors(n, suffixes, f, elems)...)
		for _, w := range want {
			ti, err := s.r.Tensor(w.name)
			if err != nil {
				return fail(w.name, fmt.Errorf("%w: rank %d lacks tensor %q", checkpoint.ErrCorrupt, m.Rank, w.name))
			}
			if ti.DType != w.dt {
				return fail(w.name, fmt.Errorf("tensor %q is %s in the checkpoint, the runtime needs %s (parameter dtype %s)", w.name, ti.DType, w.dt, dt))
			}
			if ti.Bytes != w.elems*int64(w.dt.Size()) {
				return fail(w.name, fmt.Errorf("%w: tensor %q is %d bytes, its partition [%d, %d) needs %d", checkpoint.ErrCorrupt, w.name, ti.Bytes, p[0], p[1], w.elems*int64(w.dt.Size())))
			}
		}
	}
	return nil
}

// checkCoverage checks that the saved ranks' partitions of name tile
// [0, numel) exactly.
func checkCoverage(dir string, saved []savedRank, name string, numel int) error {
	type span struct{ lo, hi, rank int }
	var spans []span
	for i, s := range saved {
		p := s.parts[name]
		if p[1] > p[0] {
			spans = append(spans, span{p[0], p[1], i})
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo < spans[j].lo })
	pos := 0
	for _, sp := range spans {
		if sp.lo != pos {
			return &checkpoint.Error{Op: "load", Path: dir, Tensor: name, Err: fmt.Errorf("%w: the saved partitions of %q leave a gap or overlap at element %d (rank %d starts at %d)", checkpoint.ErrCorrupt, name, pos, sp.rank, sp.lo)}
		}
		pos = sp.hi
	}
	if pos != numel {
		return &checkpoint.Error{Op: "load", Path: dir, Tensor: name, Err: fmt.Errorf("%w: the saved partitions of %q cover %d of %d elements", checkpoint.ErrCorrupt, name, pos, numel)}
	}
	return nil
}
