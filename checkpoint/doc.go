// Package checkpoint saves and loads zinf training checkpoints the way
// DeepSpeed's FastPersist does: each file is streamed through a few pinned
// staging buffers into O_DIRECT writes issued by the aio engine, several
// files at once, at close to the disk's bandwidth, with no whole tensor
// ever staged in the Go heap. The files are safetensors, so other tools
// read them; a manifest with a CRC-32C per tensor makes every byte
// checkable; a commit by rename makes a checkpoint appear whole or not at
// all.
//
// # Layout
//
//	<root>/step-000100/                  a committed checkpoint (the name is the caller's)
//	    checkpoint.json                  index: format, version, step, world size, config,
//	                                     model shape, user metadata, ranks (+ manifest CRCs)
//	    rank-00000/
//	        manifest.json                the rank's files (size, header CRC) and tensors
//	                                     (file, dtype, shape, offset, size, CRC-32C)
//	        params.safetensors           caller-named files: 8-byte header length, JSON
//	        optimizer.safetensors        header padded to 8 bytes, then the tensors
//	    rank-00001/ ...
//	<root>/.tmp-zinf-ckpt-step-000200-<12 hex>/        a save in progress (or a crashed one)
//	<root>/.tmp-zinf-ckpt-step-000200-<12 hex>.lock    its writer's lock (a magic line,
//	                                                   pid, host, start time)
//
// # Saving
//
//	st := checkpoint.State{Step: 100, Config: cfgJSON, Ranks: []checkpoint.RankState{{
//		Rank: 0,
//		Files: []checkpoint.TensorFile{
//			{Name: "params.safetensors", Tensors: []checkpoint.Tensor{
//				checkpoint.FromBytes("layer.0.weight", swapper.BFloat16, []int64{4096, 4096}, w0),
//				checkpoint.FromStore(store, "layer.0.weight.fp32", swapper.Float32, []int64{4096, 4096}),
//			}},
//		},
//	}}}
//	m, err := checkpoint.Save(ctx, "/ckpt/step-000100", st, checkpoint.SaveOptions{KeepLast: 3})
//
// A Writer keeps its engine and pinned memory between saves. A Saver saves
// asynchronously: SaveAsync copies the in-memory tensors into a pinned
// snapshot, pins the versions of the swap-store tensors and the bytes of
// FromPinned tensors (copy-on-write: nothing is copied), and returns;
// Handle.Wait reports the commit. At most
// one asynchronous save is in flight; the next SaveAsync waits for it (see
// Saver for the memory it holds).
//
// The zinf ckpt save-bench and bench commands measure Save against fio's
// O_DIRECT write of the same shape on the same directory, the naive Go
// writer and SaveAsync's stall, interleaved round by round.
//
// # Crash safety
//
// A save writes everything under <root>/.tmp-zinf-ckpt-<name>-<random>: the files
// (each fdatasync'ed after its last write and the truncation of its
// alignment padding), each rank's manifest.json (fsync'ed, then its
// directory), then checkpoint.json (fsync'ed, then the directory). Only
// then is the directory renamed to <root>/<name> (renameat2 with
// RENAME_NOREPLACE, or RENAME_EXCHANGE to replace under Overwrite), and
// the root fsync'ed. A checkpoint is committed exactly when
// <root>/<name>/checkpoint.json exists; Latest and List only look at
// non-hidden directories with one. Whatever instant a writer dies, the
// new name either does not exist or names a complete, durable checkpoint,
// and no older checkpoint has been touched (KeepLast deletes only after the
// commit, by renaming victims to hidden names first; RetainMatch limits it
// to the checkpoints a caller owns, and Prune applies it without a save).
//
// Telling a live writer's temporary directory from a crashed one's: before
// creating its directory a writer creates <dir>.lock, starting with a magic
// line, and holds an flock on it until the directory is gone (committed or
// removed). The kernel drops a dead process's flock, SIGKILL included.
// Each save first sweeps the root, and removes exactly the entries that a
// writer of this package left when it died: a directory whose name has
// the exact shape ".tmp-zinf-ckpt-<name>-<12 hex digits>" and whose lock
// file is one this package wrote (the magic line) and is held by nobody,
// and such lock files whose directory is gone. A directory whose lock is
// held is never touched; one of that shape without a lock file of ours is
// left and logged; anything else in the root, ".tmp-" names a user chose
// included, is never looked at. Sweep does the same without a save (a
// resumed job whose last checkpoint was already taken may never save).
//
// # Loading
//
// Open (or OpenRank, ListRanks) checks format, version and completeness;
// Reader.ReadTensor reads one tensor with O_DIRECT and checks its CRC-32C;
// Verify and Inspect check every byte. Errors wrap ErrNotCheckpoint,
// ErrVersion, ErrCorrupt or ErrShape and name the directory, file and
// tensor concerned.
//
// # Caveats
//
// swapper.Store reads whole tensors only, so a FromStore tensor is read
// into one pinned buffer of its (padded) size before it is streamed: a
// store tensor costs its size in pinned memory while its file is written.
// A ranged read on the store (ReadRange(ctx, name, off, dst) at aligned
// offsets, which its chunk layout allows) would let the writer stream it
// in staging-sized pieces instead. For the same reason a FromStoreRanges
// tensor whose ranges take turns between store tensors (an optimizer's
// three states across several sub-group records) reads each record once
// per state.
//
// All ranks of a checkpoint are saved by one Save call when they are
// simulated in one process. When they are processes, each calls
// Writer.SaveShared with its own rank: rank 0 takes the lock and creates
// the temporary directory, every rank writes its rank directory, the
// ranks agree through a comm.Comm at each stage, and rank 0 writes
// checkpoint.json and commits with the same one rename; the root must be
// on a filesystem every rank sees. Asynchronous saves (Saver) are for
// ranks in one process only.
package checkpoint
