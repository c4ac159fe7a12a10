package zinf_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/zinfio/zinf"
	"github.com/zinfio/zinf/comm"
	"github.com/zinfio/zinf/config"
	"github.com/zinfio/zinf/tensor"
)

// rangesModel: an embedding-shaped tensor, a matrix and a bias, so rows
// and ranges meet partitions at odd places.
func rangesModel(rows int) zinf.Model {
	return zinf.LayeredModel(
		[]tensor.Desc{{Name: "emb", Shape: []int{rows, 24}}},
		[]tensor.Desc{{Name: "w", Shape: []int{61, 37}}, {Name: "b", Shape: []int{37}}},
	)
}

// TestReadParamRowsAndRanges: rows (any order, duplicates, 300 scattered
// ones) and ranges of a parameter, read in every dtype from every param
// dtype — resident, and streamed in 1 MiB pieces (rows gathered into few
// store reads with checksums per 16 KiB) — and the blocks of
// ReadParamBlocks (in order, the last shorter; an error from the block
// function stops it) equal the same elements of ReadParamBytes' whole
// tensor byte for byte; bad rows, ranges and buffers are refused naming
// the tensor.
func TestReadParamRowsAndRanges(t *testing.T) {
	for _, c := range []struct {
		stored tensor.DType
		rows   int
	}{{tensor.Float32, 997}, {tensor.BFloat16, 997}, {tensor.Float16, 997}, {tensor.Float32, 44_001}, {tensor.BFloat16, 44_001}} {
		stored, nrows := c.stored, c.rows
		t.Run(fmt.Sprintf("%s/%d rows", stored, nrows), func(t *testing.T) {
			ctx, watch := watchdog(t, 2*time.Minute)
			cfg, _ := testConfig(t)
			cfg.Zinf.Tiers.CPUPinnedBytes = 32 << 20
			cfg.BF16, cfg.FP16 = stored == tensor.BFloat16, stored == tensor.Float16
			model := rangesModel(nrows)
			// 44001 rows are 2 to 4 MB: streamed in 1 MiB pieces.
			rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, PieceBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			watch(rt)
			if rt.Streamed("emb") != (nrows > 997) {
				t.Fatalf("emb streamed: %v", rt.Streamed("emb"))
			}
			rng := rand.New(rand.NewPCG(3, 4))
			for _, d := range model.Tensors {
				n, _ := d.Numel()
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				if err := rt.Init(ctx, d.Name, v); err != nil {
					t.Fatal(err)
				}
			}
			rt.Forward()
			if err := rt.BeginLayer(ctx, 0); err != nil {
				t.Fatal(err)
			}
			defer rt.EndLayer(0)
			if got := rt.RowLen("emb"); got != 24 {
				t.Fatalf("RowLen(emb) = %d, want 24", got)
			}
			for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Float16} {
				sz := dt.Size()
				whole := make([]byte, nrows*24*sz)
				if err := rt.ReadParamBytes(ctx, "emb", dt, whole); err != nil {
					t.Fatal(err)
				}
				rows := []int{nrows - 1, 0, 5, 5, 500, 17, nrows - 1}
				for range 300 {
					rows = append(rows, rng.IntN(nrows)) // scattered, as a batch's tokens are
				}
				got := make([]byte, len(rows)*24*sz)
				if err := rt.ReadParamRows(ctx, "emb", rows, dt, got); err != nil {
					t.Fatal(err)
				}
				for i, row := range rows {
					want := whole[row*24*sz : (row+1)*24*sz]
					if !bytes.Equal(got[i*24*sz:(i+1)*24*sz], want) {
						t.Fatalf("%s: row %d (index %d) differs from the whole tensor's", dt, row, i)
					}
				}
				// Blocks of 1000 rows (the last shorter), in order.
				blk := make([]byte, 1000*24*sz)
				next := 0
				if err := rt.ReadParamBlocks(ctx, "emb", dt, blk, func(row, rows int) error {
					if row != next || rows != min(1000, nrows-row) {
						return fmt.Errorf("block at row %d of %d rows, want row %d", row, rows, next)
					}
					if !bytes.Equal(blk[:rows*24*sz], whole[row*24*sz:(row+rows)*24*sz]) {
						return fmt.Errorf("block at row %d differs from the whole tensor's", row)
					}
					next += rows
					return nil
				}); err != nil || next != nrows {
					t.Fatalf("%s: blocks: %v (%d of %d rows)", dt, err, next, nrows)
				}
				stop := errors.New("enough")
				calls := 0
				if err := rt.ReadParamBlocks(ctx, "emb", dt, blk, func(int, int) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
					t.Fatalf("%s: an error from the block function: %v after %d calls", dt, err, calls)
				}
				if err := rt.ReadParamBlocks(ctx, "emb", dt, blk[:24*sz+1], func(int, int) error { return nil }); err == nil {
					t.Fatalf("%s: a destination of a row and a byte was accepted", dt)
				}
				for _, r := range [][2]int{{0, 1}, {13, 4001}, {nrows*24 - 7, nrows * 24}, {50, 50}, {7, nrows*24 - 3}} {
					got := make([]byte, (r[1]-r[0])*sz)
					if err := rt.ReadParamRange(ctx, "emb", r[0], r[1], dt, got); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, whole[r[0]*sz:r[1]*sz]) {
						t.Fatalf("%s: range %v differs from the whole tensor's", dt, r)
					}
				}
			}
			for _, bad := range []struct {
				what string
				err  error
			}{
				{"row -1", rt.ReadParamRows(ctx, "emb", []int{-1}, tensor.Float32, make([]byte, 96))},
				{"row past the last", rt.ReadParamRows(ctx, "emb", []int{nrows}, tensor.Float32, make([]byte, 96))},
				{"short buffer", rt.ReadParamRows(ctx, "emb", []int{1, 2}, tensor.Float32, make([]byte, 96))},
				{"range past the end", rt.ReadParamRange(ctx, "emb", 10, nrows*24+1, tensor.Float32, make([]byte, 4*(nrows*24-9)))},
				{"unknown tensor", rt.ReadParamRange(ctx, "nope", 0, 1, tensor.Float32, make([]byte, 4))},
			} {
				if bad.err == nil {
					t.Errorf("%s: accepted", bad.what)
				} else if want := "emb"; bad.what != "unknown tensor" && !bytes.Contains([]byte(bad.err.Error()), []byte(want)) {
					t.Errorf("%s: %v (does not name %q)", bad.what, bad.err, want)
				}
			}
		})
	}
}

// TestAccumulateGradRangesBitIdentical trains the same model twice per
// case, with the same gradients: once handed over whole (AccumulateGrad)
// to runtimes that move every tensor whole, once in pieces to runtimes
// whose embedding moves in 1 MiB pieces (parameter streamed, gradient
// kept in pieces) — rows of the embedding (only the rows a batch uses,
// with zero rows left out), ranges of random lengths, at world 2 each rank
// only its partition — over micro-steps, the second step layer-major
// (BeginLayerMicroBatches: a layer's sums held in pinned memory between
// its micro-batches), with gradient clipping (the norm of the pieces'
// sums) and -0 gradient elements. The sums, the norm, parameters, fp32
// masters and optimizer states must agree bit for bit after every step.
func TestAccumulateGradRangesBitIdentical(t *testing.T) {
	for _, world := range []int{1, 2} {
		t.Run(fmt.Sprintf("world %d", world), func(t *testing.T) {
			ctx, watch := watchdog(t, 3*time.Minute)
			// 12007 x 24 fp32 per rank is 1.15 MB: in 1 MiB pieces, the pieces
			// parameter is streamed and its gradient kept in two pieces.
			model := rangesModel(12_007 * world)
			open := func(pieceBytes int64) []*zinf.Runtime {
				comms, err := comm.NewLocal(world, comm.LocalOptions{StallTimeout: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				var rts []*zinf.Runtime
				for rank := range world {
					cfg, _ := testConfig(t)
					cfg.GradientClipping = 0.5
					cfg.GradientAccumulationSteps = 3
					cfg.ZeroOptimization.SubGroupSize = 4096
					cfg.Zinf.Tiers.CPUPinnedBytes = config.Size(16 << 20)
					rt, err := zinf.Open(cfg, model, zinf.Options{Logger: quietLog, NoBandwidthProbe: true, Rank: rank, WorldSize: world, Comm: comms[rank], PieceBytes: pieceBytes})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { rt.Close() })
					watch(rt)
					rts = append(rts, rt)
				}
				return rts
			}
			whole, pieces := open(-1), open(1<<20)
			if !pieces[0].Params.Streamed("emb") || whole[0].Params.Streamed("emb") {
				t.Fatal("the pieces' embedding is not streamed, or the whole one is")
			}
			rng := rand.New(rand.NewPCG(11, uint64(world)))
			init := map[string][]float32{}
			for _, d := range model.Tensors {
				n, _ := d.Numel()
				v := make([]float32, n)
				for i := range v {
					v[i] = float32(rng.NormFloat64())
				}
				init[d.Name] = v
				for _, rt := range append(slices.Clone(whole), pieces...) {
					if err := rt.Init(ctx, d.Name, v); err != nil {
						t.Fatal(err)
					}
				}
			}
			negZero := float32(math.Copysign(0, -1))
			for step := range 3 {
				// hand[m][i] hands micro-batch m's gradient of tensor i to
				// a pieces runtime; the whole runtimes get it whole now.
				hand := make([][]func(rt *zinf.Runtime), 3)
				for micro := range 3 {
					for _, d := range model.Tensors {
						n64, _ := d.Numel()
						n := int(n64)
						g := make([]float32, n)
						rl := n
						if len(d.Shape) > 1 {
							rl = n / d.Shape[0]
						}
						used := map[int]bool{} // rows with a gradient (an embedding's batch)
						for row := range n / rl {
							if rng.IntN(3) == 0 {
								used[row] = true
								for i := row * rl; i < (row+1)*rl; i++ {
									switch rng.IntN(8) {
									case 0:
										g[i] = negZero
									case 1:
										g[i] = 0
									default:
										g[i] = float32(rng.NormFloat64()) * 0.1
									}
								}
							}
						}
						for _, rt := range whole {
							if err := rt.AccumulateGrad(ctx, d.Name, g); err != nil {
								t.Fatal(err)
							}
						}
						// Random pieces, in a random order, covering the tensor.
						var cuts []int
						for c := 0; c < n; c += 1 + rng.IntN(n/3+1) {
							cuts = append(cuts, c)
						}
						cuts = append(cuts, n)
						order := rng.Perm(len(cuts) - 1)
						hand[micro] = append(hand[micro], func(rt *zinf.Runtime) {
							lo, hi := rt.Partition(d.Name)
							switch {
							case world > 1 && micro == 1:
								// The partition form: this rank's part only.
								if err := rt.AccumulateGradRange(ctx, d.Name, lo, slices.Clone(g[lo:hi])); err != nil {
									t.Fatal(err)
								}
							case d.Name == "emb" && micro != 2:
								var rows []int
								var vals []float32
								for row := range n / rl {
									if used[row] {
										rows = append(rows, row)
										vals = append(vals, g[row*rl:(row+1)*rl]...)
									}
								}
								if err := rt.AccumulateGradRows(ctx, d.Name, rows, vals); err != nil {
									t.Fatal(err)
								}
							default:
								for _, k := range order {
									if err := rt.AccumulateGradRange(ctx, d.Name, cuts[k], slices.Clone(g[cuts[k]:cuts[k+1]])); err != nil {
										t.Fatal(err)
									}
								}
							}
						})
					}
				}
				if step == 1 {
					// Layer-major (BeginLayerMicroBatches): a layer's
					// micro-batches back to back, its sums held in pinned
					// memory until EndLayer.
					for _, rt := range pieces {
						rt.Backward()
						for l := rt.Layers() - 1; l >= 0; l-- {
							if err := rt.BeginLayerMicroBatches(ctx, l, 3); err != nil {
								t.Fatal(err)
							}
							for micro := range 3 {
								for i, d := range model.Tensors {
									if d.Layer == l {
										hand[micro][i](rt)
									}
								}
							}
							rt.EndLayer(l)
						}
					}
				} else {
					for micro := range 3 {
						for i := range model.Tensors {
							for _, rt := range pieces {
								hand[micro][i](rt)
							}
						}
					}
				}
				stepAll := func(rts []*zinf.Runtime) {
					errs := make(chan error, len(rts))
					for _, rt := range rts {
						go func() { errs <- rt.Step(ctx) }()
					}
					for range rts {
						if err := <-errs; err != nil {
							t.Fatal(err)
						}
					}
				}
				for _, rt := range pieces {
					if err := rt.Flush(ctx); err != nil {
						t.Fatal(err)
					}
				}
				// The accumulated sums themselves (the layer below: the
				// step would hide a -0 that became +0).
				for r := range world {
					for _, d := range model.Tensors {
						lo, hi := whole[r].Partition(d.Name)
						ga, gb := make([]float32, hi-lo), make([]float32, hi-lo)
						if err := zinf.GradsOf(whole[r]).Read(ctx, d.Name, ga); err != nil {
							t.Fatal(err)
						}
						if err := zinf.GradsOf(pieces[r]).Read(ctx, d.Name, gb); err != nil {
							t.Fatal(err)
						}
						if !sameBits(ga, gb) {
							t.Fatalf("step %d rank %d %s: accumulated gradients differ", step, r, d.Name)
						}
					}
				}
				stepAll(whole)
				stepAll(pieces)
				for r := range world {
					a, b := whole[r].LastStep(), pieces[r].LastStep()
					if math.Float64bits(a.GradNorm) != math.Float64bits(b.GradNorm) || a.ClipCoef != b.ClipCoef {
						t.Fatalf("step %d rank %d: norm %v clip %v whole, %v %v in pieces", step, r, a.GradNorm, a.ClipCoef, b.GradNorm, b.ClipCoef)
					}
					if step == 0 && r == 0 && !a.Clipped {
						t.Logf("step %d not clipped (norm %v)", step, a.GradNorm)
					}
					for _, d := range model.Tensors {
						ma, sa, err := whole[r].ReadOptimizerStates(ctx, d.Name)
						if err != nil {
							t.Fatal(err)
						}
						mb, sb, err := pieces[r].ReadOptimizerStates(ctx, d.Name)
						if err != nil {
							t.Fatal(err)
						}
						if !sameBits(ma, mb) {
							t.Fatalf("step %d rank %d %s: masters differ", step, r, d.Name)
						}
						for k := range sa {
							if !sameBits(sa[k], sb[k]) {
								t.Fatalf("step %d rank %d %s: state %d differs", step, r, d.Name, k)
							}
						}
					}
				}
			}
		})
	}
}

func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
