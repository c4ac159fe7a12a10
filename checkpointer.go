package zinf

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zinfio/zinf/checkpoint"
	"github.com/zinfio/zinf/comm"
)

// DefaultCheckpointKeep is CheckpointerOptions.KeepLast's default: the
// newest three checkpoints are kept, so a checkpoint found damaged later
// (a disk error after the commit) still leaves older ones to resume from.
const DefaultCheckpointKeep = 3

// CheckpointName is the directory name a Checkpointer gives the checkpoint
// taken after step steps: "step-" and the step, at least six digits
// ("step-000010"). LatestCheckpoint and retention recognize exactly these
// names.
func CheckpointName(step int64) string { return fmt.Sprintf("step-%06d", step) }

// checkpointStep parses a CheckpointName.
func checkpointStep(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, "step-")
	if !ok || len(digits) < 6 || len(digits) > 19 {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || CheckpointName(n) != name {
		return 0, false
	}
	return n, true
}

// ownCheckpoint reports whether a committed checkpoint is one a
// Checkpointer made: named by CheckpointName after the step it records.
func ownCheckpoint(c checkpoint.Info) bool {
	n, ok := checkpointStep(c.Name)
	return ok && n == c.Step
}

// LatestCheckpoint returns the newest committed checkpoint under root that
// a Checkpointer wrote: the highest step among the directories named by
// CheckpointName whose checkpoint.json records that step. Other entries
// in root (a user's own checkpoint, files, hidden temporary directories of
// saves in progress or interrupted) are never candidates. With none, the
// error wraps checkpoint.ErrNoCheckpoint. A missing root has none.
//
// A directory named by CheckpointName after every committed one, whose
// checkpoint.json cannot be read (damaged, missing, of another format), is
// an error naming it and what is wrong (wrapping checkpoint.ErrCorrupt, or
// the sentinel of what was found): it is not passed over for an older
// checkpoint, which would silently retrain its steps and then fail to save
// over it. To resume from an older one, load that one by name
// (LoadCheckpoint) or move the damaged one out of root.
func LatestCheckpoint(root string) (checkpoint.Info, error) {
	list, err := checkpoint.List(root)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return checkpoint.Info{}, &checkpoint.Error{Op: "latest", Path: root, Err: checkpoint.ErrNoCheckpoint}
		}
		return checkpoint.Info{}, err
	}
	latest, found := checkpoint.Info{}, false
	for i := len(list) - 1; i >= 0; i-- {
		if ownCheckpoint(list[i]) {
			latest, found = list[i], true
			break
		}
	}
	if err := damagedAfter(root, latest, found); err != nil {
		return checkpoint.Info{}, err
	}
	if !found {
		return checkpoint.Info{}, &checkpoint.Error{Op: "latest", Path: root, Err: checkpoint.ErrNoCheckpoint}
	}
	return latest, nil
}

// damagedAfter returns an error naming the newest directory of root named
// by CheckpointName, after latest (any, when found is false), whose
// checkpoint.json cannot be read, if there is one.
func damagedAfter(root string, latest checkpoint.Info, found bool) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil // List read it a moment ago; its own error stands
	}
	bad, badStep := "", int64(-1)
	for _, e := range entries {
		step, ok := checkpointStep(e.Name())
		if !ok || !e.IsDir() || step <= badStep || (found && step <= latest.Step) {
			continue
		}
		if _, err := checkpoint.ReadManifest(filepath.Join(root, e.Name())); err != nil {
			bad, badStep = e.Name(), step
		}
	}
	if bad == "" {
		return nil
	}
	dir := filepath.Join(root, bad)
	_, cause := checkpoint.ReadManifest(dir)
	older := "there is no older committed checkpoint to resume from"
	if found {
		older = fmt.Sprintf("to resume from the older %s, move %s out of %s, or load the older one by name and save into another directory (zinf train --resume-from %s --checkpoint-dir NEW)",
			latest.Name, bad, root, latest.Dir)
	}
	var ce *checkpoint.Error
	if errors.As(cause, &ce) {
		cause = ce.Err
	}
	return &checkpoint.Error{Op: "latest", Path: dir, Err: fmt.Errorf("the newest checkpoint cannot be loaded: %w; it is not passed over for an older one (that would retrain its steps); %s", cause, older)}
}

// ResumeLatest loads the newest committed checkpoint under root
// (LatestCheckpoint) into rts with LoadCheckpoint, at whatever world size
// rts have, and returns which one it was and its metadata: meta.Step is
// the number of steps done, where the training loop continues. With no
// checkpoint under root the error wraps checkpoint.ErrNoCheckpoint and
// the runtimes are untouched.
func ResumeLatest(ctx context.Context, root string, rts []*Runtime) (checkpoint.Info, CheckpointMeta, error) {
	info, err := LatestCheckpoint(root)
	if err != nil {
		return checkpoint.Info{}, CheckpointMeta{}, err
	}
	meta, err := LoadCheckpoint(ctx, info.Dir, rts)
	if err != nil {
		return info, CheckpointMeta{}, err
	}
	return info, meta, nil
}

// CheckpointerOptions configure a Checkpointer.
type CheckpointerOptions struct {
	// Every is the checkpoint interval in steps: Due(step) is true after
	// every Every steps. At least 1.
	Every int64
	// KeepLast is how many of the Checkpointer's checkpoints (named by
	// CheckpointName) are kept in the root: after each commit the older
	// ones are deleted, crash-safely (checkpoint.SaveOptions.KeepLast).
	// Nothing else in the root is ever deleted. 0 means
	// DefaultCheckpointKeep; -1 keeps every checkpoint.
	KeepLast int
	// Async saves through a checkpoint.Saver: Save returns once the
	// snapshot is taken and training may step while it drains (see
	// SaveCheckpointAsync for what that pins). The snapshot costs pinned
	// memory of the checkpoint's size, outside the runtimes' pools. At
	// most one save drains at a time: the next Save waits for it.
	Async bool
	// Save configures each save's writer (staging buffers, engine,
	// logger). Its KeepLast, RetainMatch and Overwrite must be left zero:
	// the Checkpointer sets them.
	Save checkpoint.SaveOptions
	// Logger receives warnings. Default slog.Default().
	Logger *slog.Logger
	// Comm, for a job whose ranks are processes (every rank opens its own
	// Checkpointer on the same root, on a filesystem they all see): rank
	// 0 alone locks the root, sweeps and prunes it, and each Save is
	// collective (see SaveCheckpoint). Async is not supported with it.
	Comm comm.Comm
}

// CheckpointRecord is one committed save of a Checkpointer.
type CheckpointRecord struct {
	// Step is the number of steps done when it was taken.
	Step int64 `json:"step"`
	// Dir is the committed checkpoint's directory.
	Dir string `json:"dir"`
	// Bytes is the size of its tensor files (every rank's).
	Bytes int64 `json:"bytes"`
	// Seconds is the time from the call to Save to the commit.
	Seconds float64 `json:"seconds"`
	// StallSeconds is how long Save held the caller: the whole save when
	// synchronous, the snapshot when asynchronous.
	StallSeconds float64 `json:"stall_seconds"`
}

// Checkpointer saves a training job's checkpoints into one root directory
// at a fixed interval, named by CheckpointName, keeping the newest
// KeepLast of them; LatestCheckpoint and ResumeLatest find and load the
// newest one after a crash. It holds an advisory lock (flock) on the root
// while open, so two jobs never checkpoint into one root at once.
//
// A training loop calls Due after each optimizer step and Save when it is
// due (and after the last step), between steps, on every rank's runtime,
// then Close once before closing the runtimes. Methods are not safe for
// concurrent use.
type Checkpointer struct {
	root  string
	opts  CheckpointerOptions
	lock  *os.File
	saver *checkpoint.Saver
	log   *slog.Logger

	mu      sync.Mutex
	records []CheckpointRecord
	pending *pendingSave
	closed  bool
}

// pendingSave is an asynchronous save not yet collected.
type pendingSave struct {
	h     *checkpoint.Handle
	step  int64
	t0    time.Time
	stall time.Duration
	done  chan struct{} // closed once rec and err are set
	rec   CheckpointRecord
	err   error
}

// OpenCheckpointer creates root if needed, takes its lock and returns a
// Checkpointer saving there. It refuses a root another open Checkpointer
// (in this or another process) holds. Then it tidies the root after a
// crash: it removes the temporary entries of saves that died
// (checkpoint.Sweep) and applies KeepLast to the checkpoints already there
// (checkpoint.Prune), both limited to what zinf's checkpoints are made of.
func OpenCheckpointer(root string, opts CheckpointerOptions) (*Checkpointer, error) {
	var errs []error
	if root == "" {
		errs = append(errs, errors.New("zinf: checkpointer: no root directory"))
	}
	if opts.Every < 1 {
		errs = append(errs, fmt.Errorf("zinf: checkpointer: Every %d is invalid (allowed: 1 or more steps)", opts.Every))
	}
	if opts.KeepLast < -1 {
		errs = append(errs, fmt.Errorf("zinf: checkpointer: KeepLast %d is invalid (allowed: -1 for all, 0 for the default %d, or 1 or more)", opts.KeepLast, DefaultCheckpointKeep))
	}
	if opts.Comm != nil && opts.Async {
		errs = append(errs, errSharedAsync)
	}
	if opts.Save.KeepLast != 0 || opts.Save.RetainMatch != nil || opts.Save.Overwrite {
		errs = append(errs, errors.New("zinf: checkpointer: CheckpointerOptions.Save must leave KeepLast, RetainMatch and Overwrite zero (the checkpointer sets them)"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	switch opts.KeepLast {
	case 0:
		opts.KeepLast = DefaultCheckpointKeep
	case -1:
		opts.KeepLast = 0 // checkpoint.SaveOptions: keep all
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Save.Logger == nil {
		opts.Save.Logger = opts.Logger
	}
	opts.Save.KeepLast = opts.KeepLast
	opts.Save.RetainMatch = ownCheckpoint
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("zinf: checkpointer: creating the checkpoint root: %w", err)
	}
	if opts.Comm != nil && opts.Comm.Rank() != 0 {
		// Rank 0 holds the root for the job.
		return &Checkpointer{root: root, opts: opts, log: opts.Logger}, nil
	}
	lock, err := lockRoot(root)
	if err != nil {
		return nil, err
	}
	// What a killed job left: its interrupted save's temporary directory,
	// and the retention it did not get to, which no later save may come
	// to fix when that job's last checkpoint was committed.
	checkpoint.Sweep(root, opts.Logger)
	checkpoint.Prune(root, opts.KeepLast, ownCheckpoint, opts.Logger)
	c := &Checkpointer{root: root, opts: opts, lock: lock, log: opts.Logger}
	if opts.Async {
		c.saver = checkpoint.NewSaver(checkpoint.SaverOptions{Logger: opts.Logger})
	}
	return c, nil
}

// Root is the directory the checkpoints are saved in.
func (c *Checkpointer) Root() string { return c.root }

// Due reports whether a checkpoint is due after step steps: a positive
// multiple of Every.
func (c *Checkpointer) Due(step int64) bool { return step > 0 && step%c.opts.Every == 0 }

// Save saves rts (every rank of the job, in rank order; see
// SaveCheckpoint — or, with CheckpointerOptions.Comm, this process's
// rank's runtime alone, every rank calling Save: SaveCheckpointShared) as
// the checkpoint CheckpointName(meta.Step) in the root.
// Synchronous, it returns once the checkpoint is committed and durable.
// Asynchronous, it first waits for the save in flight, returning its error
// if it failed, then returns once the new snapshot is taken; Close (or the
// next Save) reports how it ended. A checkpoint of that step already in
// the root is an error wrapping checkpoint.ErrExists: a Checkpointer never
// overwrites one.
func (c *Checkpointer) Save(ctx context.Context, rts []*Runtime, meta CheckpointMeta) error {
	if c.closed {
		return fmt.Errorf("zinf: checkpointer: Save after Close: %w", checkpoint.ErrClosed)
	}
	if meta.Step < 0 {
		return fmt.Errorf("zinf: checkpointer: step %d is negative", meta.Step)
	}
	if err := c.collect(true); err != nil {
		return err
	}
	dir := filepath.Join(c.root, CheckpointName(meta.Step))
	t0 := time.Now()
	if c.saver == nil {
		var m *checkpoint.Manifest
		var err error
		if c.opts.Comm != nil {
			if len(rts) != 1 {
				return fmt.Errorf("zinf: checkpointer: with CheckpointerOptions.Comm each rank saves its own runtime (%d given)", len(rts))
			}
			m, err = SaveCheckpointShared(ctx, dir, rts[0], meta, c.opts.Save)
		} else {
			m, err = SaveCheckpoint(ctx, dir, rts, meta, c.opts.Save)
		}
		if err != nil {
			return err
		}
		d := time.Since(t0).Seconds()
		c.mu.Lock()
		c.records = append(c.records, CheckpointRecord{Step: meta.Step, Dir: dir, Bytes: fileBytes(m), Seconds: d, StallSeconds: d})
		c.mu.Unlock()
		return nil
	}
	h, err := SaveCheckpointAsync(ctx, c.saver, dir, rts, meta, c.opts.Save)
	if err != nil {
		return err
	}
	p := &pendingSave{h: h, step: meta.Step, t0: t0, stall: time.Since(t0), done: make(chan struct{})}
	go func() {
		m, err := h.Wait()
		p.rec = CheckpointRecord{Step: p.step, Dir: dir, Seconds: time.Since(p.t0).Seconds(), StallSeconds: p.stall.Seconds()}
		if err == nil {
			p.rec.Bytes = fileBytes(m)
		}
		p.err = err
		close(p.done)
	}()
	c.mu.Lock()
	c.pending = p
	c.mu.Unlock()
	return nil
}

// collect records the asynchronous save in flight once it has finished,
// waiting for it when wait is set; it returns that save's error.
func (c *Checkpointer) collect(wait bool) error {
	c.mu.Lock()
	p := c.pending
	c.mu.Unlock()
	if p == nil {
		return nil
	}
	if !wait {
		select {
		case <-p.done:
		default:
			return nil
		}
	}
	<-p.done
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = nil
	if p.err != nil {
		return fmt.Errorf("zinf: checkpointer: the asynchronous save of step %d failed: %w", p.step, p.err)
	}
	c.records = append(c.records, p.rec)
	return nil
}

// Records returns the committed saves so far, oldest first (an
// asynchronous save counts once it has committed).
func (c *Checkpointer) Records() []CheckpointRecord {
	_ = c.collect(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]CheckpointRecord(nil), c.records...)
}

// Close waits for the save in flight, returning its error, frees the
// asynchronous saver's memory and releases the root's lock. Close it
// before closing the runtimes it saves. It is safe to call more than once.
func (c *Checkpointer) Close() error {
	if c.closed {
		return nil
	}
	c.closed = true
	err := c.collect(true)
	if c.saver != nil {
		err = errors.Join(err, c.saver.Close())
	}
	if c.lock != nil {
		err = errors.Join(err, c.lock.Close())
	}
	return err
}

// fileBytes is the size of a checkpoint's tensor files (their tensors'
// bytes when this process wrote one rank of a job whose ranks are
// processes).
func fileBytes(m *checkpoint.Manifest) int64 {
	var n int64
	if m == nil {
		return 0
	}
	if len(m.RankManifests) < len(m.Ranks) {
		for _, r := range m.Ranks {
			n += r.TensorBytes
		}
		return n
	}
	for _, rm := range m.RankManifests {
		for _, f := range rm.Files {
			n += f.Bytes
		}
	}
	return n
}
