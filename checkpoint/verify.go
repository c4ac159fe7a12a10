package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"text/tabwriter"

	"golang.org/x/sync/errgroup"

	"github.com/zinfio/zinf/internal/base/crc32c"
	"github.com/zinfio/zinf/internal/base/units"
)

// Report is the outcome of Verify.
type Report struct {
	Dir       string // the checkpoint directory
	Name      string
	Step      int64
	WorldSize int
	// Ranks, Files and Tensors count what was checked; Bytes is the file
	// bytes read.
	Ranks, Files, Tensors int
	Bytes                 int64
	// Problems lists everything found wrong, in rank and file order.
	Problems []Problem
	// Results has one entry per tensor checked (rank, file and layout
	// order).
	Results []TensorResult
}

// OK reports whether nothing was found wrong.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Problem is one thing Verify found wrong. Tensor and File are empty when
// the problem is not about one tensor or file.
type Problem struct {
	Rank   int
	File   string
	Tensor string
	Err    error
}

func (p Problem) String() string {
	s := fmt.Sprintf("rank %d", p.Rank)
	if p.File != "" {
		s += " file " + p.File
	}
	if p.Tensor != "" {
		s += fmt.Sprintf(" tensor %q", p.Tensor)
	}
	return s + ": " + p.Err.Error()
}

// TensorResult is one tensor's check.
type TensorResult struct {
	Rank int
	TensorInfo
	// Got is the CRC-32C of the bytes on disk.
	Got uint32
	OK  bool
}

// Verify checks a whole checkpoint (dir is the checkpoint directory; a
// rank directory checks that rank only): checkpoint.json, every rank's
// manifest, every file's presence, size and safetensors header (checksum,
// and agreement with the manifest), and every tensor's CRC-32C, reading
// every byte once. It returns the report and, when anything is wrong, an
// error wrapping the sentinel of the first problem (ErrCorrupt for damage,
// ErrNotCheckpoint / ErrVersion when dir cannot be read as a checkpoint).
// A problem in one file does not stop the others from being checked.
func Verify(ctx context.Context, dir string) (Report, error) {
	return verify(ctx, dir, ReadOptions{})
}

func verify(ctx context.Context, dir string, opts ReadOptions) (Report, error) {
	rep, err := verifyReport(ctx, dir, opts)
	return *rep, err
}

func verifyReport(ctx context.Context, dir string, opts ReadOptions) (*Report, error) {
	if err := opts.ensureDefaults(); err != nil {
		return &Report{Dir: dir}, &Error{Op: "verify", Path: dir, Err: err}
	}
	ckpt, only, err := resolveRank(dir, -1)
	if err != nil {
		return &Report{Dir: dir}, &Error{Op: "verify", Path: dir, Err: err}
	}
	idx, err := readIndex(ckpt)
	if err != nil {
		return &Report{Dir: ckpt}, &Error{Op: "verify", Path: ckpt, Err: err}
	}
	rep := &Report{Dir: ckpt, Name: idx.Name, Step: idx.Step, WorldSize: idx.WorldSize}
	if opts.Engine == nil {
		eng, err := newDefaultEngine(opts.Logger)
		if err != nil {
			return rep, &Error{Op: "verify", Path: ckpt, Err: err}
		}
		defer eng.Close()
		opts.Engine = eng
	}
	var mu sync.Mutex
	problem := func(p Problem) {
		mu.Lock()
		rep.Problems = append(rep.Problems, p)
		mu.Unlock()
	}
	for rank := range idx.WorldSize {
		if only >= 0 && rank != only {
			continue
		}
		rep.Ranks++
		r, err := OpenWith(ckpt, rank, opts)
		if err != nil {
			var ce *Error
			if errors.As(err, &ce) {
				err = ce.Err
			}
			problem(Problem{Rank: rank, File: fileOf(ce), Err: err})
			continue
		}
		type fileRes struct {
			results []TensorResult
			bytes   int64
		}
		res := make([]fileRes, len(r.m.Files))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(2)
		for i := range r.m.Files {
			fe := &r.m.Files[i]
			g.Go(func() error {
				results, n, probs := r.verifyFile(gctx, fe)
				res[i] = fileRes{results, n}
				for _, p := range probs {
					problem(p)
				}
				return gctx.Err()
			})
		}
		err = g.Wait()
		r.Close()
		if err != nil {
			return rep, &Error{Op: "verify", Path: ckpt, Err: err}
		}
		for _, fr := range res {
			rep.Files++
			rep.Tensors += len(fr.results)
			rep.Bytes += fr.bytes
			rep.Results = append(rep.Results, fr.results...)
		}
	}
	slices.SortStableFunc(rep.Problems, func(a, b Problem) int {
		if a.Rank != b.Rank {
			return a.Rank - b.Rank
		}
		switch {
		case a.File < b.File:
			return -1
		case a.File > b.File:
			return 1
		}
		return 0
	})
	if len(rep.Problems) > 0 {
		first := rep.Problems[0]
		more := ""
		if len(rep.Problems) > 1 {
			more = fmt.Sprintf(" (and %d more problems)", len(rep.Problems)-1)
		}
		return rep, &Error{Op: "verify", Path: ckpt, Tensor: first.Tensor, Err: fmt.Errorf("%s%s: %w", first.where(), more, first.Err)}
	}
	return rep, nil
}

func (p Problem) where() string {
	s := fmt.Sprintf("rank %d", p.Rank)
	if p.File != "" {
		s += " file " + p.File
	}
	return s
}

func fileOf(e *Error) string {
	if e == nil || filepath.Ext(e.Path) != ".safetensors" {
		return ""
	}
	return filepath.Base(e.Path)
}

// verifyFile checks one file's header and every tensor in it, streaming
// the file once.
func (r *Reader) verifyFile(ctx context.Context, fe *FileEntry) ([]TensorResult, int64, []Problem) {
	rank := r.m.Rank
	var probs []Problem
	bad := func(tensor string, err error) {
		probs = append(probs, Problem{Rank: rank, File: fe.Name, Tensor: tensor, Err: err})
	}
	path := filepath.Join(r.rankDir, fe.Name)
	of, err := r.file(ctx, fe.Name)
	if err != nil && of == nil {
		var ce *Error
		if errors.As(err, &ce) && errors.Is(err, ErrCorrupt) {
			// The header check (Reader.checkHeader, the rule ReadTensor
			// applies too) failed: say how, then still check the
			// tensors' data (their places come from the manifest).
			bad("", ce.Err)
			of, err = r.fileNoHeaderCheck(fe.Name)
		}
		if err != nil {
			bad("", err)
			return nil, 0, probs
		}
	}
	var tensors []*TensorEntry
	for i := range r.m.Tensors {
		if r.m.Tensors[i].File == fe.Name {
			tensors = append(tensors, &r.m.Tensors[i])
		}
	}
	// Data: one pass, a running CRC per tensor.
	results := make([]TensorResult, len(tensors))
	for i, t := range tensors {
		results[i] = TensorResult{Rank: rank, TensorInfo: t.info()}
	}
	ti := 0
	pos := fe.HeaderBytes
	var crc uint32
	for ti < len(tensors) && tensors[ti].Bytes == 0 {
		results[ti].OK = tensors[ti].CRC32C == 0
		ti++
	}
	err = r.stream(ctx, of, fe.HeaderBytes, fe.Bytes, func(p []byte) error {
		for len(p) > 0 && ti < len(tensors) {
			t := tensors[ti]
			n := min(int64(len(p)), t.Offset+t.Bytes-pos)
			crc = crc32c.Update(crc, p[:n])
			p = p[n:]
			pos += n
			if pos == t.Offset+t.Bytes {
				results[ti].Got = crc
				results[ti].OK = crc == t.CRC32C
				crc = 0
				ti++
				for ti < len(tensors) && tensors[ti].Bytes == 0 {
					results[ti].OK = tensors[ti].CRC32C == 0
					ti++
				}
			}
		}
		return nil
	})
	if err != nil {
		bad("", fmt.Errorf("reading %s: %w", path, err))
		return results, pos, probs
	}
	for _, res := range results {
		if !res.OK {
			bad(res.Name, corruptf("checksum mismatch: the bytes at offset %d..%d have crc32c %08x, the manifest says %08x",
				res.Offset, res.Offset+res.Bytes, res.Got, res.CRC32C))
		}
	}
	return results, fe.Bytes, probs
}

// fileNoHeaderCheck returns the opened file even though its header check
// failed (Verify still checks the tensors).
func (r *Reader) fileNoHeaderCheck(name string) (*openFile, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if of := r.open[name]; of != nil {
		return of, nil
	}
	return nil, fmt.Errorf("file %s not open", name)
}

// checkHeaderAgainst parses a safetensors header and checks it describes
// exactly the manifest's tensors of the file.
func checkHeaderAgainst(hb []byte, fe *FileEntry, tensors []*TensorEntry) error {
	h, err := parseHeader(hb)
	if err != nil {
		return err
	}
	if h.headerBytes != fe.HeaderBytes {
		return fmt.Errorf("header is %d bytes, the manifest says %d", h.headerBytes, fe.HeaderBytes)
	}
	if len(h.tensors) != len(tensors) {
		return fmt.Errorf("header lists %d tensors, the manifest %d", len(h.tensors), len(tensors))
	}
	for _, t := range tensors {
		ht, ok := h.tensors[t.Name]
		if !ok {
			return fmt.Errorf("tensor %q is in the manifest but not in the header", t.Name)
		}
		rel := t.Offset - fe.HeaderBytes
		if ht.DType != t.DType || !slices.Equal(ht.Shape, t.Shape) || ht.DataOffsets != [2]int64{rel, rel + t.Bytes} {
			return fmt.Errorf("tensor %q: header says %s %v at %v, the manifest %s %v at [%d %d]",
				t.Name, ht.DType, ht.Shape, ht.DataOffsets, t.DType, t.Shape, rel, rel+t.Bytes)
		}
	}
	if h.headerBytes+h.dataBytes() != fe.Bytes {
		return fmt.Errorf("header describes %d bytes, the file has %d", h.headerBytes+h.dataBytes(), fe.Bytes)
	}
	return nil
}

// Inspect writes a human-readable description of the checkpoint dir to w:
// its metadata, then per rank and file every tensor with dtype, shape,
// size and CRC-32C, each verified against the bytes on disk. It returns
// Verify's error when anything is wrong (after printing everything).
func Inspect(ctx context.Context, dir string, w io.Writer) error {
	rep, verr := Verify(ctx, dir)
	if rep.Name == "" {
		return verr
	}
	idx, err := readIndex(rep.Dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "checkpoint %s\n", rep.Dir)
	fmt.Fprintf(w, "  format %s version %d, name %s, step %d, world size %d, created %s\n",
		idx.Format, idx.Version, idx.Name, idx.Step, idx.WorldSize, idx.Created.Format("2006-01-02 15:04:05 MST"))
	if len(idx.Config) > 0 {
		fmt.Fprintf(w, "  config: %d bytes of JSON\n", len(idx.Config))
	}
	if len(idx.ModelShape) > 0 {
		fmt.Fprintf(w, "  model shape: %d parameters\n", len(idx.ModelShape))
	}
	for _, k := range sortedKeys(idx.User) {
		fmt.Fprintf(w, "  user %s = %q\n", k, idx.User[k])
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	lastRank, lastFile := -1, ""
	for _, res := range rep.Results {
		if res.Rank != lastRank {
			tw.Flush()
			e := idx.Ranks[res.Rank]
			fmt.Fprintf(w, "rank %d (%s): %d files, %d tensors, %s\n", res.Rank, e.Dir, e.Files, e.Tensors, humanBytes(e.TensorBytes))
			lastRank, lastFile = res.Rank, ""
		}
		if res.File != lastFile {
			tw.Flush()
			size := int64(-1)
			if st, err := os.Stat(filepath.Join(rep.Dir, rankDirName(res.Rank), res.File)); err == nil {
				size = st.Size()
			}
			fmt.Fprintf(w, "  %s (%s)\n", res.File, humanBytes(size))
			fmt.Fprintf(tw, "    TENSOR\tDTYPE\tSHAPE\tBYTES\tCRC32C\tSTATUS\n")
			lastFile = res.File
		}
		status := "ok"
		if !res.OK {
			status = fmt.Sprintf("BAD (crc32c on disk %08x)", res.Got)
		}
		fmt.Fprintf(tw, "    %s\t%s\t%v\t%d\t%08x\t%s\n", res.Name, res.DType.SafetensorsName(), res.Shape, res.Bytes, res.CRC32C, status)
	}
	tw.Flush()
	for _, p := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM %s\n", p)
	}
	if verr == nil {
		fmt.Fprintf(w, "verified: %d ranks, %d files, %d tensors, %s read, all checksums match\n", rep.Ranks, rep.Files, rep.Tensors, humanBytes(rep.Bytes))
	} else {
		fmt.Fprintf(w, "FAILED: %d problems\n", len(rep.Problems))
	}
	return verr
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func humanBytes(n int64) string {
	return units.FormatBytes(n)
}
