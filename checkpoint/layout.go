package checkpoint

import (
	"path/filepath"
	"sort"
	"time"
)

// plannedTensor is a tensor with its place in its file; crc is filled in as
// its bytes are staged.
type plannedTensor struct {
	t      *Tensor
	offset int64 // absolute file offset
	crc    uint32
}

// plannedFile is one safetensors file to write: its header, its tensors in
// layout order, and its exact length.
type plannedFile struct {
	rank    int
	name    string // base name
	relPath string // rank-NNNNN/name, relative to the checkpoint dir
	header  []byte // 8-byte length + padded JSON
	tensors []*plannedTensor
	length  int64
}

// plan is a whole checkpoint laid out: files per rank, plus the metadata.
type plan struct {
	name    string // checkpoint name (the directory's base name)
	state   *State
	created time.Time
	files   []*plannedFile   // all ranks, rank-major
	ranks   [][]*plannedFile // per rank of the world, in the State's file order
	present []int            // the ranks the State holds, in order
	total   int64            // bytes of all files
	// maxStorePadded is the largest padded length of a FromStore tensor
	// (0 if none): the pinned bounce buffer one writer needs.
	maxStorePadded int64
}

// makePlan lays out st. The state has been validated.
func makePlan(name string, st *State) (*plan, error) {
	p := &plan{name: name, state: st, created: time.Now().UTC(), ranks: make([][]*plannedFile, st.world())}
	byRank := make([]*RankState, st.world())
	for i := range st.Ranks {
		byRank[st.Ranks[i].Rank] = &st.Ranks[i]
	}
	for _, r := range byRank {
		if r == nil {
			continue // another process's rank (SaveShared)
		}
		p.present = append(p.present, r.Rank)
		meta := headerMeta(st, r, name)
		for fi := range r.Files {
			f := &r.Files[fi]
			pf := &plannedFile{rank: r.Rank, name: f.Name, relPath: filepath.Join(rankDirName(r.Rank), f.Name)}
			for ti := range f.Tensors {
				t := &f.Tensors[ti]
				pf.tensors = append(pf.tensors, &plannedTensor{t: t})
				for _, n := range t.storeLens {
					p.maxStorePadded = max(p.maxStorePadded, t.store.PaddedLen(n))
				}
			}
			// Wider dtypes first so every tensor starts aligned to its
			// element size (the data section starts at a multiple of 8).
			sort.SliceStable(pf.tensors, func(i, j int) bool {
				return pf.tensors[i].t.DType.Size() > pf.tensors[j].t.DType.Size()
			})
			h, err := encodeHeader(pf.tensors, meta)
			if err != nil {
				return nil, err
			}
			pf.header = h
			off := int64(len(h))
			for _, pt := range pf.tensors {
				pt.offset = off
				off += pt.t.Bytes
			}
			pf.length = off
			p.total += off
			p.files = append(p.files, pf)
			p.ranks[r.Rank] = append(p.ranks[r.Rank], pf)
		}
	}
	return p, nil
}
