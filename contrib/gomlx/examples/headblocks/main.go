// Command headblocks measures what streaming an output head in blocks of
// its table would keep bit for bit on GoMLX's Go backend (the question a
// blocked tied head in zgomlx must answer first): the logits x·Eᵀ, the
// table's gradient dlᵀ·x and the input's gradient dl·E (a sum over the
// vocabulary, the partial products of the blocks added in order),
// computed block by block, against one Einsum over the whole table.
//
//	go run ./examples/headblocks            # 64 tokens, d=32, vocab 100277, blocks of 8192
//
// It prints, per way of handling the last (short) block, how many
// elements differ from the whole-table Einsum; then how the input's
// gradient of the head written blockwise in one graph compares with the
// blocks' own backward graphs added in order and in reverse.
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand"
	"os"
	"slices"

	"github.com/gomlx/compute"
	_ "github.com/gomlx/compute/gobackend"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	zgomlx "github.com/zinfio/zinf/contrib/gomlx"
)

func main() {
	tokens := flag.Int("tokens", 64, "rows of x (batch x sequence)")
	dim := flag.Int("dim", 32, "embedding dimension")
	vocab := flag.Int("vocab", 100277, "rows of the table")
	block := flag.Int("block", 8192, "rows per block")
	flag.Parse()
	if *tokens < 1 || *dim < 1 || *vocab < 1 || *block < 1 {
		fmt.Fprintf(os.Stderr, "headblocks: -tokens %d -dim %d -vocab %d -block %d (allowed: each >= 1)\n", *tokens, *dim, *vocab, *block)
		os.Exit(2)
	}
	if err := run(*tokens, *dim, *vocab, *block); err != nil {
		fmt.Fprintln(os.Stderr, "headblocks:", err)
		os.Exit(1)
	}
}

func run(T, D, V, B int) error {
	b, err := compute.NewWithConfig(zgomlx.DefaultBackend)
	if err != nil {
		return err
	}
	r := rand.New(rand.NewSource(1))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return v
	}
	x, E, dl := rnd(T*D), rnd(V*D), rnd(T*V)
	mm := func(eq string) (*graph.Exec, error) {
		return graph.NewExec(b, func(a, c *graph.Node) *graph.Node { return graph.Einsum(eq, a, c) })
	}
	fwd, err := mm("td,vd->tv")
	if err != nil {
		return err
	}
	dE, err := mm("tv,td->vd")
	if err != nil {
		return err
	}
	dx, err := mm("tv,vd->td")
	if err != nil {
		return err
	}
	call := func(e *graph.Exec, a, c *tensors.Tensor) ([]float32, error) {
		o, err := e.Call1(a, c)
		if err != nil {
			return nil, err
		}
		return tensors.CopyFlatData[float32](o)
	}
	xt := tensors.FromFlatDataAndDimensions(x, T, D)
	dlt := tensors.FromFlatDataAndDimensions(dl, T, V)
	wl, err := call(fwd, xt, tensors.FromFlatDataAndDimensions(E, V, D))
	if err != nil {
		return err
	}
	wdE, err := call(dE, dlt, xt)
	if err != nil {
		return err
	}
	wdx, err := call(dx, dlt, tensors.FromFlatDataAndDimensions(E, V, D))
	if err != nil {
		return err
	}
	fmt.Printf("x [%d, %d], table [%d, %d], blocks of %d rows (%d, the last %d rows), backend %q\n", T, D, V, D, B, (V+B-1)/B, V-(V-1)/B*B, zgomlx.DefaultBackend)
	for _, pad := range []bool{false, true} {
		bl := make([]float32, T*V)
		bdE := make([]float32, V*D)
		bdx := make([]float32, T*D)
		for v0 := 0; v0 < V; v0 += B {
			v1 := min(v0+B, V)
			n, m := v1-v0, v1-v0
			if pad {
				m = B // the short block padded with zero rows
			}
			eb := make([]float32, m*D)
			copy(eb, E[v0*D:v1*D])
			db := make([]float32, T*m)
			for t := range T {
				copy(db[t*m:t*m+n], dl[t*V+v0:t*V+v1])
			}
			Eb, dlb := tensors.FromFlatDataAndDimensions(eb, m, D), tensors.FromFlatDataAndDimensions(db, T, m)
			l, err := call(fwd, xt, Eb)
			if err != nil {
				return err
			}
			for t := range T {
				copy(bl[t*V+v0:t*V+v1], l[t*m:t*m+n])
			}
			g, err := call(dE, dlb, xt)
			if err != nil {
				return err
			}
			copy(bdE[v0*D:v1*D], g[:n*D])
			p, err := call(dx, dlb, Eb)
			if err != nil {
				return err
			}
			for i := range bdx {
				if v0 == 0 {
					bdx[i] = p[i]
				} else {
					bdx[i] += p[i]
				}
			}
		}
		how := "the last block alone"
		if pad {
			how = "the last block padded to the block's rows with zeros"
		}
		fmt.Printf("%s: logits differ in %d of %d, the table's gradient in %d of %d, the input's gradient in %d of %d\n",
			how, diff(wl, bl), len(wl), diff(wdE, bdE), len(wdE), diff(wdx, bdx), len(wdx))
	}
	return blockwiseGraph(b, x, E, dl, T, D, V, B)
}

// blockwiseGraph compares the input's gradient of a head written
// blockwise in one graph (logits = the blocks' Einsums concatenated, the
// last block padded with zero rows) with the blocks' own backward graphs
// run one by one and their products added in order, and in reverse.
func blockwiseGraph(b compute.Backend, x, E, dl []float32, T, D, V, B int) error {
	nb := (V + B - 1) / B
	pE := make([]float32, nb*B*D) // the table padded to whole blocks
	copy(pE, E)
	pdl := make([]float32, T*nb*B) // [T, nb*B], zero in the padding
	for t := range T {
		copy(pdl[t*nb*B:t*nb*B+V], dl[t*V:(t+1)*V])
	}
	whole, err := graph.NewExec(b, func(ins []*graph.Node) []*graph.Node {
		x, d := ins[0], ins[1]
		var ls []*graph.Node
		for _, e := range ins[2:] {
			ls = append(ls, graph.Einsum("td,vd->tv", x, e))
		}
		obj := graph.ReduceAllSum(graph.Mul(graph.Concatenate(ls, 1), d))
		return graph.Gradient(obj, x)
	})
	if err != nil {
		return err
	}
	one, err := graph.NewExec(b, func(x, e, d *graph.Node) *graph.Node {
		return graph.Gradient(graph.ReduceAllSum(graph.Mul(graph.Einsum("td,vd->tv", x, e), d)), x)[0]
	})
	if err != nil {
		return err
	}
	xt := tensors.FromFlatDataAndDimensions(x, T, D)
	args := []any{xt, tensors.FromFlatDataAndDimensions(pdl, T, nb*B)}
	var parts [][]float32
	for i := range nb {
		eb := tensors.FromFlatDataAndDimensions(pE[i*B*D:(i+1)*B*D], B, D)
		args = append(args, eb)
		db := make([]float32, T*B)
		for t := range T {
			copy(db[t*B:(t+1)*B], pdl[t*nb*B+i*B:t*nb*B+(i+1)*B])
		}
		o, err := one.Call1(xt, eb, tensors.FromFlatDataAndDimensions(db, T, B))
		if err != nil {
			return err
		}
		p, err := tensors.CopyFlatData[float32](o)
		if err != nil {
			return err
		}
		parts = append(parts, p)
	}
	o, err := whole.Call1(args...)
	if err != nil {
		return err
	}
	w, err := tensors.CopyFlatData[float32](o)
	if err != nil {
		return err
	}
	sum := func(order []int) []float32 {
		s := slices.Clone(parts[order[0]])
		for _, i := range order[1:] {
			for j := range s {
				s[j] += parts[i][j]
			}
		}
		return s
	}
	fwd := make([]int, nb)
	rev := make([]int, nb)
	for i := range nb {
		fwd[i], rev[i] = i, nb-1-i
	}
	fmt.Printf("the head written blockwise in one graph: its input's gradient vs the blocks' backward graphs added in order differs in %d of %d, added last block first in %d of %d\n",
		diff(w, sum(fwd)), len(w), diff(w, sum(rev)), len(w))
	return nil
}

func diff(a, b []float32) int {
	n := 0
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n
}
