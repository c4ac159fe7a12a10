package checkpoint

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/zinfio/zinf/aio"
	"github.com/zinfio/zinf/comm"
)

// SaveShared saves a checkpoint whose ranks are separate processes (an
// MPI job, say): every rank of c calls it, each with a State holding its
// own rank only (State.Ranks[0].Rank == c.Rank(); the rest of the State
// the same on every rank), and dir on a filesystem every rank sees.
//
// Rank 0 sweeps the root, takes the writer's lock and creates the
// temporary directory; every rank writes its rank directory into it
// (its files fdatasync'ed, its manifest fsync'ed); once every rank has,
// rank 0 writes checkpoint.json, commits by rename and applies KeepLast,
// as Save does. The ranks agree at each stage through c, so every rank
// returns the same outcome: the manifest (Ranks lists every rank;
// RankManifests holds this rank's only), or an error naming the first
// rank that failed — and then nothing was committed, and rank 0 removed
// the temporary directory. A failure of c itself (a dead rank) fails the
// save on every rank that sees it; the lock of a rank 0 that died is
// released by the kernel and a later save sweeps what it left.
func (w *Writer) SaveShared(ctx context.Context, dir string, state State, opts SaveOptions, c comm.Comm) (*Manifest, error) {
	me, n := c.Rank(), c.Size()
	state.WorldSize = n
	var local error
	if len(state.Ranks) != 1 || state.Ranks[0].Rank != me {
		local = &Error{Op: "save", Path: dir, Err: invalidf("SaveShared on rank %d needs a State holding rank %d only (it has %d ranks)", me, me, len(state.Ranks))}
	}
	var root, name string
	var p *plan
	if local == nil {
		root, name, p, local = prepareSave(dir, &state, &opts)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var eng aio.Engine
	if local == nil {
		eng, local = w.engineFor(dir, opts)
	}
	// Rank 0 creates the temporary directory and holds its lock.
	var tx *txn
	if me == 0 && local == nil {
		cleanStale(root, opts.Logger)
		var err error
		if tx, err = begin(root, name, opts.Overwrite, opts.Logger); err != nil {
			local = err
		} else {
			defer tx.abort()
		}
	}
	// agree gathers every rank's stage; the first rank that failed fails
	// the save on every rank.
	agree := func(what string, mine sharedStage) ([]sharedStage, error) {
		if local != nil {
			mine = sharedStage{Err: local.Error()}
		}
		all, err := allGatherJSON(ctx, c, mine)
		if err != nil {
			return nil, &Error{Op: "save", Path: dir, Err: fmt.Errorf("%s: %w", what, err)}
		}
		for q, s := range all {
			if s.Err == "" {
				continue
			}
			if q == me {
				return nil, local
			}
			return nil, &Error{Op: "save", Path: dir, Err: fmt.Errorf("rank %d failed: %s", q, s.Err)}
		}
		return all, nil
	}
	var first sharedStage
	if tx != nil {
		first.Tmp = tx.tmp
	}
	all, err := agree("agreeing on the temporary directory", first)
	if err != nil {
		return nil, err
	}
	tmp := all[0].Tmp
	// Every rank writes its own rank directory.
	if st, err := os.Stat(tmp); err != nil || !st.IsDir() {
		local = &Error{Op: "save", Path: tmp, Err: fmt.Errorf("rank %d does not see rank 0's temporary directory: the checkpoint root must be on a filesystem every rank shares (%v)", me, err)}
	}
	var rms []*RankManifest
	var mine sharedStage
	if local == nil {
		local = w.writeFiles(ctx, dir, eng, tmp, p, opts)
	}
	if local == nil {
		mine.Entries, rms, local = writeRankManifests(tmp, p)
	}
	if local == nil {
		local = ctx.Err()
	}
	if all, err = agree("gathering the ranks' manifests", mine); err != nil {
		return nil, err
	}
	var entries []RankEntry
	for _, s := range all {
		entries = append(entries, s.Entries...)
	}
	// Rank 0 commits; every rank learns how that went.
	var m *Manifest
	if me == 0 {
		if m, local = writeIndex(tmp, p, entries, rms); local == nil {
			local = tx.commit()
		}
	}
	if _, err := agree("committing", sharedStage{}); err != nil {
		return nil, err
	}
	final := filepath.Join(root, name)
	if me == 0 {
		retain(root, name, opts.KeepLast, opts.RetainMatch, opts.Logger)
	} else {
		st := p.state
		m = &Manifest{Format: FormatName, Version: FormatVersion, Name: name, Step: st.Step, WorldSize: n, Created: p.created,
			Config: rawConfig(st.Config), ModelShape: st.ModelShape, User: st.User, Ranks: entries, RankManifests: rms}
	}
	m.Dir = final
	return m, nil
}

// sharedStage is what a rank tells the others at each stage of
// SaveShared.
type sharedStage struct {
	Tmp     string      `json:"tmp,omitempty"`
	Err     string      `json:"err,omitempty"`
	Entries []RankEntry `json:"entries,omitempty"`
}

// allGatherJSON gives every rank every rank's v (JSON), in rank order.
func allGatherJSON[T any](ctx context.Context, c comm.Comm, v T) ([]T, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	n := c.Size()
	lens := make([]byte, 8*n)
	mine := make([]byte, 8)
	binary.LittleEndian.PutUint64(mine, uint64(len(b)))
	eight := make([]int, n)
	for q := range eight {
		eight[q] = 8
	}
	if err := c.AllGather(ctx, mine, lens, eight); err != nil {
		return nil, err
	}
	counts := make([]int, n)
	for q := range counts {
		l := binary.LittleEndian.Uint64(lens[8*q:])
		if l > 64<<20 {
			return nil, fmt.Errorf("rank %d sends %d bytes of metadata (at most 64 MiB)", q, l)
		}
		counts[q] = int(l)
	}
	off, total := comm.Offsets(counts)
	recv := make([]byte, total)
	if err := c.AllGather(ctx, b, recv, counts); err != nil {
		return nil, err
	}
	out := make([]T, n)
	for q := range out {
		if err := json.Unmarshal(recv[off[q]:off[q]+counts[q]], &out[q]); err != nil {
			return nil, fmt.Errorf("rank %d's metadata: %w", q, err)
		}
	}
	return out, nil
}
