package kernels

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Matrix is a row-major weight matrix of Rows x Cols as Hugging Face and
// GGUF store a linear layer's weight (out features x in features): row r
// holds the weights of output r, in Type, RowBytes(Type, Cols) bytes a
// row, rows back to back. Data is read, never written or retained past a
// call; it needs no alignment.
type Matrix struct {
	Type       DType
	Rows, Cols int
	Data       []byte
}

// ErrClosed is returned by the products of a closed Pool.
var ErrClosed = errors.New("kernels: the pool is closed")

// Options configure a Pool.
type Options struct {
	// Workers is the number of goroutines a product is split over (the
	// calling one included); 0 means runtime.GOMAXPROCS(0).
	Workers int
	// Kernel names the kernel to use (one of Kernels()); "" picks the
	// first, the fastest this machine has. Every kernel gives the same
	// bits, so this matters for speed and for tests only.
	Kernel string
}

// minRowsPerWorker keeps small products on fewer goroutines: handing a
// worker less than this costs more than it saves.
const minRowsPerWorker = 16

// chunksPerWorker is how many chunks a row or in-out product is cut into
// per worker (at most): the chunks are taken from a shared counter, so a
// worker that a busy core slows takes fewer of them.
const chunksPerWorker = 4

// MaxWorkers bounds Options.Workers (a product's chunks are counted in 16
// bits).
const MaxWorkers = 1024

// Pool splits products over a bounded set of worker goroutines by ranges
// of rows. A product allocates nothing in the steady state. Products on
// one Pool run one at a time (each uses every worker); a Pool is safe for
// concurrent use.
type Pool struct {
	mu      sync.Mutex
	k       *kernel
	workers int
	closed  bool   // under mu
	gen     uint32 // the generation of the last product handed out, under mu
	job     job    // the product in progress, under mu
	// state is the hand-out of the product in progress: its generation
	// (bits 32-63), its chunks (16-31) and the next chunk not yet taken
	// (0-15). Every goroutine of the pool takes chunks from it (a compare
	// and swap each) until none are left, so that a worker slowed by
	// something else on its core leaves its share to the others instead
	// of making them wait; the caller writes job before it stores a new
	// generation, and changes job only once pending is zero.
	state   atomic.Uint64
	pending atomic.Int32 // chunks of the product in progress not finished
	// A worker that polled workerSpin for a product in vain sleeps on
	// park (sleepers counts them); a caller that polled waitSpin for its
	// chunks sleeps on done (waiting says so). Each side stores its own
	// flag before it reads the other's, so that one of them always sees
	// the other and nobody sleeps through a wake-up.
	parkMu, doneMu sync.Mutex
	park, done     *sync.Cond
	sleepers       atomic.Int32
	waiting        atomic.Bool
	stop           atomic.Bool // Close was called
	// scratch holds each goroutine's partial sums (the caller's first):
	// on the heap once, since a frame's would escape through the
	// kernel's function value.
	scratch []chunkScratch
	// qx and xd hold the vectors of a block format's product quantized
	// (quantizeActs), under mu: grown, never shrunk.
	qx []byte
	xd []float32
}

// job is one product, split into chunks of rows.
type job struct {
	w      Matrix          // an in-out product's matrix
	reduce reduceFunc      // the row blocks' reduction of their partial sums
	io     ioFunc          // an in-out product's kernel
	inout  bool            // an in-out product (MatMulInOut): chunks of columns
	fn     func(chunk int) // Parallel's function, or nil
	rb     int             // bytes of a row of an in-out product
	x, y   []float32       // y: an in-out product's
	qx     []byte          // x quantized, for the block formats' parts
	xd     []float32       // the scales of qx's blocks
	batch  int
	chunks int
	tile   int // columns a tile
	// parts are a row product's matrices (MatMul one, MatMuls up to
	// MaxShared), their rows taken as one run of rows: chunks split
	// the run.
	parts  [MaxShared]part
	nparts int
	rows   int // the parts' rows together
}

// part is one matrix of a row product and its output.
type part struct {
	w    Matrix
	row  blockFunc  // F32 and BF16
	qrow qblockFunc // the block formats
	rb   int        // bytes of a row
	n    int        // columns the row function covers
	b32  int        // bytes of 32 columns
	y    []float32
}

// MaxShared is the most matrices one MatMuls call multiplies with the
// same vectors: the queries, keys and values of an attention layer, or
// an FFN's gate and up projections.
const MaxShared = 4

// rowBlock is the number of rows a chunk takes through the column tiles
// together: each tile of the vectors is read from the first level cache
// once it is there, by rowBlock rows.
const rowBlock = 8

// tileBytes bounds the bytes of the vectors a column tile covers (all the
// batch's vectors together), so that they stay near the core (a first
// level cache's worth, the second level's at worst) while rowBlock rows
// stream through it. Tiles of 8 KiB cut the decoder's rows into pieces
// (a batch of four took a 1024-column row in two), each piece a stream
// too short to read at the memory's pace: on the 400 M llama's layer
// shapes from memory, 32 KiB read 5-30% more weights a CPU second on one
// core than 8 KiB (f32, bf16, Q8_0; batch 1 and 4), and 128 KiB no more.
const tileBytes = 32 << 10

// chunkScratch is one chunk's partial sums, padded so that neighbouring
// chunks share no cache line.
type chunkScratch struct {
	acc [rowBlock]accs
	_   [64]byte
}

// NewPool starts a pool's workers. Close stops them.
func NewPool(o Options) (*Pool, error) {
	if o.Workers < 0 {
		return nil, fmt.Errorf("kernels: Options.Workers %d is negative (0 means GOMAXPROCS)", o.Workers)
	}
	k := findKernel(o.Kernel)
	if k == nil {
		return nil, fmt.Errorf("kernels: Options.Kernel %q is not one of this machine's kernels %q", o.Kernel, Kernels())
	}
	if o.Workers > MaxWorkers {
		return nil, fmt.Errorf("kernels: Options.Workers %d is above %d", o.Workers, MaxWorkers)
	}
	workers := o.Workers
	if workers == 0 {
		workers = min(runtime.GOMAXPROCS(0), MaxWorkers)
	}
	p := &Pool{k: k, workers: workers, scratch: make([]chunkScratch, workers)}
	p.park, p.done = sync.NewCond(&p.parkMu), sync.NewCond(&p.doneMu)
	for w := 1; w < workers; w++ {
		go p.worker(w)
	}
	return p, nil
}

// Kernel returns the name of the pool's kernel.
func (p *Pool) Kernel() string { return p.k.name }

// Workers returns the number of goroutines a product is split over.
func (p *Pool) Workers() int { return p.workers }

// Close stops the pool's workers; later products return ErrClosed.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		p.stop.Store(true)
		p.parkMu.Lock()
		p.park.Broadcast()
		p.parkMu.Unlock()
	}
}

// workerSpin is how long a worker that finished a chunk polls for the
// next product before it sleeps, and waitSpin how long a product's caller
// polls for its workers' chunks before it sleeps. A decoder's products
// follow one another within microseconds, while waking a sleeping
// goroutine on an idle processor (a futex, on a virtual machine an
// interrupt to a halted CPU) took about as long as a whole 1024 x 1024
// product's chunk: with sleeping workers two workers ran such a product
// no faster than one.
const (
	workerSpin = 200 * time.Microsecond
	waitSpin   = 2 * time.Millisecond
)

// spinPolls is how many times spin polls between two yields of the
// processor: a yield takes the scheduler's locks (a microsecond or so),
// while a poll is a load from a cache line that stays in the core's cache
// until it changes. Yielding every poll spent a fifth of a decoding
// step's CPU time in the scheduler.
const spinPolls = 64

// spin polls cond, yielding the processor every spinPolls polls (so that
// a pool of more workers than GOMAXPROCS, or other goroutines, still
// run), until it holds or d has passed; it reports whether cond held.
func spin(cond func() bool, d time.Duration) bool {
	start := time.Now()
	for k := 1; ; k++ {
		if cond() {
			return true
		}
		if k%spinPolls == 0 {
			if time.Since(start) > d {
				return false
			}
			runtime.Gosched()
		}
	}
}

// genOf returns the generation of a hand-out state.
func genOf(v uint64) uint32 { return uint32(v >> 32) }

func (p *Pool) worker(w int) {
	sc := &p.scratch[w]
	var seen uint32 // the last generation this worker took part in
	for {
		fresh := func() bool { return genOf(p.state.Load()) != seen || p.stop.Load() }
		if !spin(fresh, workerSpin) {
			p.parkMu.Lock()
			p.sleepers.Add(1)
			for !fresh() {
				p.park.Wait()
			}
			p.sleepers.Add(-1)
			p.parkMu.Unlock()
		}
		if p.stop.Load() {
			return
		}
		seen = genOf(p.state.Load())
		p.take(seen, sc)
	}
}

// take runs chunks of the product of generation gen with the scratch sc
// until none is left to take.
func (p *Pool) take(gen uint32, sc *chunkScratch) {
	for {
		v := p.state.Load()
		next, chunks := int(v&0xffff), int(v>>16&0xffff)
		if genOf(v) != gen || next >= chunks {
			return
		}
		if !p.state.CompareAndSwap(v, v+1) {
			continue
		}
		p.job.run(next, sc)
		if p.pending.Add(-1) == 0 && p.waiting.Load() {
			p.doneMu.Lock()
			p.done.Broadcast()
			p.doneMu.Unlock()
		}
	}
}

// runJob runs p.job (under p.mu) on the workers and the calling
// goroutine, which take its chunks from p.state, and returns when all
// have finished.
func (p *Pool) runJob() {
	n := p.job.chunks
	if n == 1 {
		p.job.run(0, &p.scratch[0])
		return
	}
	p.gen++
	p.pending.Store(int32(n))
	p.state.Store(uint64(p.gen)<<32 | uint64(n)<<16)
	if p.sleepers.Load() > 0 {
		p.parkMu.Lock()
		p.park.Broadcast()
		p.parkMu.Unlock()
	}
	p.take(p.gen, &p.scratch[0])
	finished := func() bool { return p.pending.Load() == 0 }
	if !spin(finished, waitSpin) {
		p.doneMu.Lock()
		p.waiting.Store(true)
		for !finished() {
			p.done.Wait()
		}
		p.waiting.Store(false)
		p.doneMu.Unlock()
	}
}

var defaultPool = sync.OnceValue(func() *Pool {
	p, err := NewPool(Options{})
	if err != nil {
		panic(err) // unreachable: the default options are valid
	}
	return p
})

// MatMul computes y[b*Rows+r] = sum over c of W[r][c] * x[b*Cols+c] for
// the batch vectors b (1 to MaxBatch) on a pool of GOMAXPROCS workers
// shared by the process. See Pool.MatMul.
func MatMul(y []float32, w Matrix, x []float32, batch int) error {
	return defaultPool().MatMul(y, w, x, batch)
}

// MatMul computes y[b*Rows+r] = sum over c of W[r][c] * x[b*Cols+c] for
// the batch vectors b (1 to MaxBatch), reading each weight from memory
// once for all of them and widening it in registers (a block format's
// weights multiply the vectors quantized to 8-bit blocks, as the package
// documentation says). x holds batch*Cols values, y batch*Rows; the sums follow the accumulation order
// of the package documentation, so every kernel and every split gives the
// same bits. Bad shapes return an error and leave y untouched.
func (p *Pool) MatMul(y []float32, w Matrix, x []float32, batch int) error {
	rb, err := check(y, w, x, batch)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.job = job{reduce: p.k.reduceRows(), x: x, batch: batch}
	p.job.addPart(p.k, w, y, rb)
	p.quantizeX(w.Cols)
	p.runRows()
	return nil
}

// MatMuls computes ys[i] = ws[i] times the batch vectors x, as MatMul
// does each (the same bits), for up to MaxShared matrices of the same
// Cols in one split over the workers: their rows are taken as one run,
// so that the products cost one hand-out to the workers and one wait
// for them instead of one each. Bad shapes return an error and leave
// every ys[i] untouched.
func (p *Pool) MatMuls(ys [][]float32, ws []Matrix, x []float32, batch int) error {
	if len(ws) < 1 || len(ws) > MaxShared || len(ys) != len(ws) {
		return fmt.Errorf("kernels: MatMuls of %d matrices and %d outputs, want 1..%d of each, as many outputs as matrices", len(ws), len(ys), MaxShared)
	}
	var rbs [MaxShared]int
	for i, w := range ws {
		if w.Cols != ws[0].Cols {
			return fmt.Errorf("kernels: MatMuls: matrix %d has %d columns, matrix 0 %d (want the same: they share the vectors)", i, w.Cols, ws[0].Cols)
		}
		rb, err := check(ys[i], w, x, batch)
		if err != nil {
			return fmt.Errorf("kernels: MatMuls: matrix %d: %w", i, err)
		}
		rbs[i] = rb
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.job = job{reduce: p.k.reduceRows(), x: x, batch: batch}
	for i, w := range ws {
		p.job.addPart(p.k, w, ys[i], rbs[i])
	}
	p.quantizeX(ws[0].Cols)
	p.runRows()
	return nil
}

// addPart adds the matrix w (rb bytes a row) and its output y to a row
// product.
func (j *job) addPart(k *kernel, w Matrix, y []float32, rb int) {
	n := w.Cols &^ (Lanes - 1)
	if w.Type.quantized() {
		n = w.Cols
	}
	b32, _ := RowBytes(w.Type, BlockSize)
	j.parts[j.nparts] = part{w: w, row: k.row(w.Type), qrow: k.qrow(w.Type), rb: rb, n: n, b32: b32, y: y}
	j.nparts++
	j.rows += w.Rows
}

// quantizeX quantizes the vectors of the row product p.job (its parts
// added, under p.mu; cols columns) for its block formats' parts, once
// for all of them, into the pool's buffers.
func (p *Pool) quantizeX(cols int) {
	j := &p.job
	quant := false
	for k := range j.nparts {
		quant = quant || j.parts[k].w.Type.quantized()
	}
	if !quant || cols == 0 {
		return
	}
	n := j.batch * cols
	if len(p.qx) < n {
		p.qx = make([]byte, n)
		p.xd = make([]float32, n/BlockSize)
	}
	j.qx, j.xd = p.qx[:n], p.xd[:n/BlockSize]
	p.k.quantize(j.qx, j.xd, j.x)
}

// runRows splits the row product p.job (its parts added, under p.mu)
// into chunks and runs them.
func (p *Pool) runRows() {
	j := &p.job
	chunks := min(chunksPerWorker*p.workers, (j.rows+minRowsPerWorker-1)/minRowsPerWorker)
	if p.workers == 1 {
		chunks = 1
	}
	j.chunks = max(chunks, 1)
	j.tile = max(BlockSize, tileBytes/4/j.batch/BlockSize*BlockSize)
	p.runJob()
	p.job = job{} // drop the references to the caller's slices
}

// MatMuls is Pool.MatMuls on the pool of GOMAXPROCS workers that MatMul
// uses.
func MatMuls(ys [][]float32, ws []Matrix, x []float32, batch int) error {
	return defaultPool().MatMuls(ys, ws, x, batch)
}

// check validates a product's shapes and returns the bytes of a row.
func check(y []float32, w Matrix, x []float32, batch int) (int, error) {
	if batch < 1 || batch > MaxBatch {
		return 0, fmt.Errorf("kernels: batch %d is outside 1..%d", batch, MaxBatch)
	}
	if w.Rows < 0 || w.Cols < 0 || w.Rows > MaxDim || w.Cols > MaxDim {
		return 0, fmt.Errorf("kernels: matrix shape %d x %d is outside 0..%d", w.Rows, w.Cols, MaxDim)
	}
	rb, err := RowBytes(w.Type, w.Cols)
	if err != nil {
		return 0, err
	}
	if w.Rows > 0 && rb > 0 && w.Rows > len(w.Data)/rb || w.Rows*rb != len(w.Data) {
		return 0, fmt.Errorf("kernels: a %v matrix of %d x %d takes %d bytes a row, Data has %d bytes (want rows*%d)", w.Type, w.Rows, w.Cols, rb, len(w.Data), rb)
	}
	if len(x) != batch*w.Cols {
		return 0, fmt.Errorf("kernels: x has %d values, want batch %d x cols %d = %d", len(x), batch, w.Cols, batch*w.Cols)
	}
	if len(y) != batch*w.Rows {
		return 0, fmt.Errorf("kernels: y has %d values, want batch %d x rows %d = %d", len(y), batch, w.Rows, batch*w.Rows)
	}
	return rb, nil
}

// run computes chunk i of the job with the scratch sc (of the goroutine
// running it): of a row product's rows, rowBlock rows at a time, each
// block through the columns in tiles (the partial sums carried from tile
// to tile), then reduced, then the tail columns.
func (j *job) run(i int, sc *chunkScratch) {
	if j.fn != nil {
		j.fn(i)
		return
	}
	if j.inout {
		j.runInOut(i)
		return
	}
	// Chunk i's share of the parts' rows taken as one run.
	lo, hi := j.rows*i/j.chunks, j.rows*(i+1)/j.chunks
	start := 0
	for k := range j.nparts {
		pt := &j.parts[k]
		plo, phi := max(lo, start)-start, min(hi, start+pt.w.Rows)-start
		start += pt.w.Rows
		if plo < phi {
			j.runPart(pt, sc, plo, phi)
		}
	}
}

// runPart computes rows lo..hi-1 of the part pt with the scratch sc:
// rowBlock rows at a time, each block through the columns in tiles (the
// partial sums carried from tile to tile), then reduced, then the tail
// columns.
func (j *job) runPart(pt *part, sc *chunkScratch, lo, hi int) {
	cols := pt.w.Cols
	for r0 := lo; r0 < hi; r0 += rowBlock {
		r1 := min(hi, r0+rowBlock)
		// Only the batch's vectors' sums: the kernels touch no others.
		for r := r0; r < r1; r++ {
			clear(sc.acc[r-r0][:j.batch])
		}
		for c0 := 0; c0 < pt.n; c0 += j.tile {
			nc := min(j.tile, pt.n-c0)
			off := c0 / BlockSize * pt.b32
			if pt.qrow != nil {
				pt.qrow(pt.w.Data[r0*pt.rb+off:r1*pt.rb], pt.rb, r1-r0, nc, j.qx[c0:], j.xd[c0/BlockSize:], cols, cols/BlockSize, j.batch, &sc.acc)
				continue
			}
			pt.row(pt.w.Data[r0*pt.rb+off:r1*pt.rb], pt.rb, r1-r0, nc, j.x[c0:], cols, j.batch, &sc.acc)
		}
		for b := range j.batch {
			ys := pt.y[b*pt.w.Rows+r0 : b*pt.w.Rows+r1]
			if pt.n > 0 {
				j.reduce(&sc.acc, b, r1-r0, ys)
			} else {
				clear(ys)
			}
			if pt.n == cols {
				continue
			}
			// The tail of an F32 or BF16 row past the last whole group
			// of Lanes columns, one column at a time.
			for r := r0; r < r1; r++ {
				row := pt.w.Data[r*pt.rb : (r+1)*pt.rb]
				s := ys[r-r0]
				for c := pt.n; c < cols; c++ {
					s = FMA32(weightAt(pt.w.Type, row, c), j.x[b*cols+c], s)
				}
				ys[r-r0] = s
			}
		}
	}
}

// weightAt returns weight c of an F32 or BF16 row.
func weightAt(t DType, row []byte, c int) float32 {
	if t == BF16 {
		return BF16ToFloat32(le16(row[2*c:]))
	}
	return f32At(row, c)
}

// F32Matrix returns a Matrix of type F32 over w (rows*cols values, row
// major) without copying: its Data aliases w's memory.
func F32Matrix(rows, cols int, w []float32) (Matrix, error) {
	if rows < 0 || cols < 0 || rows > MaxDim || cols > MaxDim {
		return Matrix{}, fmt.Errorf("kernels: matrix shape %d x %d is outside 0..%d", rows, cols, MaxDim)
	}
	if cols > 0 && rows > len(w)/cols || len(w) != rows*cols {
		return Matrix{}, fmt.Errorf("kernels: a %d x %d matrix has %d values, w has %d", rows, cols, rows*cols, len(w))
	}
	m := Matrix{Type: F32, Rows: rows, Cols: cols}
	if len(w) > 0 {
		m.Data = unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w))
	}
	return m, nil
}
