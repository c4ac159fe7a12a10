package kernels

// The Go side of the generated kernels (amd64 and arm64): how a product
// calls them over its rows, vectors and columns.

// asmFunc is the signature of the generated kernels.
type asmFunc func(w *byte, wstride int, x *float32, xstride, n int, acc *float32)

// asmKernels are one dtype's kernels: by[nb-1][rows] serves nb vectors and
// rows rows at once (nil where none was generated; rows 1 always is).
type asmKernels [4][5]asmFunc

// ioAsm is a generated in-out kernel: n columns, width at a time, for nb
// vectors.
type ioAsm func(w *byte, wstride int, x *float32, xstride, rows int, y *float32, ystride, n int)

// ioKernels are one dtype's in-out kernels by number of vectors (index
// nb-1): the wide one, then the 8-column one.
type ioKernels [4][2]struct {
	width int
	f     ioAsm
}

// ioTile is the columns a group of vectors takes before the next group
// of a batch of more than four vectors takes the same: the weights of a
// block's rows for that many columns stay in the first level cache.
const ioTile = 256

// asmInOut makes an ioFunc of one dtype's in-out kernels (es bytes a
// weight; n a multiple of 8): the vectors in groups of up to four, each
// group's widest kernel over as many columns as it takes, its 8-column
// kernel over the rest; a batch of more than four in tiles of ioTile
// columns, so that the second group reads the weights from the cache.
func asmInOut(es int, k ioKernels) ioFunc {
	return func(w []byte, wstride, rows, n int, x []float32, xstride, nb int, y []float32, ystride int) {
		if rows == 0 || n == 0 {
			return
		}
		tile := n
		if nb > 4 {
			tile = ioTile
		}
		for c0 := 0; c0 < n; c0 += tile {
			cn := min(tile, n-c0)
			for b0 := 0; b0 < nb; b0 += 4 {
				g := &k[min(4, nb-b0)-1]
				c := c0
				for _, kw := range g {
					if m := (c0 + cn - c) / kw.width * kw.width; m > 0 {
						kw.f(&w[c*es], wstride, &x[b0*xstride], 4*xstride, rows, &y[b0*ystride+c], 4*ystride, m)
						c += m
					}
				}
			}
		}
	}
}

// asmBlock makes a blockFunc of one dtype's kernels: the vectors in
// groups of up to four (a batch of more than four takes the run of
// columns twice, its bytes read from memory by the first group and from
// the cache by the second), the rows in the widest steps generated for the
// group's size, the rest one at a time.
func asmBlock(k asmKernels) blockFunc {
	return func(w []byte, wstride, nrows, n int, x []float32, xstride, nb int, acc *[rowBlock]accs) {
		if n == 0 {
			return
		}
		for b0 := 0; b0 < nb; b0 += 4 {
			g := min(4, nb-b0)
			byRows := &k[g-1]
			r := 0
			for _, step := range [...]int{4, 2} {
				if f := byRows[step]; f != nil {
					for ; r+step <= nrows; r += step {
						f(&w[r*wstride], wstride, &x[b0*xstride], 4*xstride, n, &acc[r][b0][0])
					}
				}
			}
			for ; r < nrows; r++ {
				byRows[1](&w[r*wstride], wstride, &x[b0*xstride], 4*xstride, n, &acc[r][b0][0])
			}
		}
	}
}

// qasmFunc is the signature of the generated block-format kernels (amd64):
// rows rows, one after the other, in one call.
type qasmFunc func(w *byte, wstride int, qx *byte, xd *float32, xstride, dstride, n int, acc *float32, rows int)

// asmQBlock makes a qblockFunc of one block format's kernels (by[nb-1]
// serves nb vectors): the vectors in groups of up to four, each group's
// rows in one call.
func asmQBlock(by [4]qasmFunc) qblockFunc {
	return func(w []byte, wstride, nrows, n int, qx []byte, xd []float32, xstride, dstride, nb int, acc *[rowBlock]accs) {
		if n == 0 || nrows == 0 {
			return
		}
		_ = w[(nrows-1)*wstride] // the last row starts within w
		_ = acc[nrows-1]
		for b0 := 0; b0 < nb; b0 += 4 {
			by[min(4, nb-b0)-1](&w[0], wstride, &qx[b0*xstride], &xd[b0*dstride], xstride, 4*dstride, n, &acc[0][b0][0], nrows)
		}
	}
}

// asmRowsFunc is the signature of the generated f32 and bf16 row kernels
// on amd64: groups groups of rows, one after the other, in one call.
type asmRowsFunc func(w *byte, wstride int, x *float32, xstride, n int, acc *float32, groups int)

// asmRowsKernels are one dtype's amd64 kernels: by[nb-1][rows] serves nb
// vectors and rows rows at once (nil where none was generated; rows 1
// always is).
type asmRowsKernels [4][5]asmRowsFunc

// asmRowsBlock is asmBlock for kernels that loop over the rows
// themselves: a call a row cost a tenth of a decoding step's products.
func asmRowsBlock(k asmRowsKernels) blockFunc {
	return func(w []byte, wstride, nrows, n int, x []float32, xstride, nb int, acc *[rowBlock]accs) {
		if n == 0 || nrows == 0 {
			return
		}
		for b0 := 0; b0 < nb; b0 += 4 {
			g := min(4, nb-b0)
			byRows := &k[g-1]
			r := 0
			for _, step := range [...]int{4, 2} {
				if f := byRows[step]; f != nil {
					if groups := (nrows - r) / step; groups > 0 {
						f(&w[r*wstride], wstride, &x[b0*xstride], 4*xstride, n, &acc[r][b0][0], groups)
						r += groups * step
					}
				}
			}
			if r < nrows {
				byRows[1](&w[r*wstride], wstride, &x[b0*xstride], 4*xstride, n, &acc[r][b0][0], nrows-r)
			}
		}
	}
}
