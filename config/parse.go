package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/zinfio/zinf/regfile"
)

// MaxFileBytes bounds a config file. Real configs are a few KiB; the bound
// keeps a mistaken path (a device such as /dev/zero, a log file, a pipe that
// never ends) from being read until memory runs out.
const MaxFileBytes = 16 << 20

// ErrNotRegular is matched (errors.Is) by Load's error for a path that is
// not a regular file: a named pipe, a device, a socket, a directory.
var ErrNotRegular = regfile.ErrNotRegular

// Load reads the config file at path and parses it. Errors name the file:
// a read failure is the *os.PathError, anything else an *Error whose Source
// is path. Only a regular file (or a symbolic link to one) is read: a
// named pipe, a device, a socket or a directory is refused without being
// opened, with an error naming what it is (a pipe would block the open
// until a writer came; a device such as /dev/zero never ends). A file
// larger than MaxFileBytes is refused from its size, without reading it.
func Load(path string) (*Config, error) {
	f, st, err := regfile.Open(path)
	if err != nil {
		var nr *regfile.NotRegularError
		if errors.As(err, &nr) {
			return nil, fmt.Errorf("config: %w", &os.PathError{Op: "open", Path: path,
				Err: fmt.Errorf("%w: it is %s; a config is read from a regular file (write it to one)", regfile.ErrNotRegular, nr.Kind)})
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	if st.Size() > MaxFileBytes {
		return nil, tooLarge(path, st.Size())
	}
	// One byte past the bound tells "exactly the limit" from "more", should
	// the file have grown since the stat.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(data) > MaxFileBytes {
		return nil, tooLarge(path, -1)
	}
	c, err := Parse(data)
	if err != nil {
		if e, ok := err.(*Error); ok {
			e.Source = path
		}
		return nil, err
	}
	c.Source = path
	return c, nil
}

// tooLarge is Load's error for a file over MaxFileBytes; size is -1 when
// the file has no size to report (a pipe or a device).
func tooLarge(path string, size int64) error {
	msg := fmt.Sprintf("the file is larger than the %s limit for a config file", Size(MaxFileBytes))
	if size >= 0 {
		msg = fmt.Sprintf("the file holds %d bytes, more than the %s limit for a config file", size, Size(MaxFileBytes))
	}
	return &Error{Source: path, Problems: []Problem{{Msg: msg + "; is this the right file?"}}}
}

// Parse reads a config from JSON text, applies the defaults and validates
// the result. The JSON must be strictly valid (a syntax error is reported
// with its line and column) and its top level an object.
//
// Every key is sorted into one of three kinds (see the package
// documentation): keys zinf reads are parsed and checked; DeepSpeed keys zinf
// does not act on are accepted and listed in Config.Ignored and a warning;
// any other key is a problem, with a "did you mean" suggestion when one is
// close. Parse reports every problem at once as an *Error: unknown and
// duplicate keys, wrong types, out-of-range values and broken cross-field
// rules (those of Validate). Data longer than MaxFileBytes is refused
// before any of it is decoded.
func Parse(data []byte) (*Config, error) {
	if len(data) > MaxFileBytes {
		// The same bound as Load, so that no caller can make Parse build a
		// tree of unbounded size.
		return nil, &Error{Problems: []Problem{{Msg: fmt.Sprintf("the config is %d bytes, more than the %s limit", len(data), Size(MaxFileBytes))}}}
	}
	c, problems, written := decode(data)
	if c != nil {
		if err := c.Validate(); err != nil {
			reported := map[string]bool{}
			for _, p := range problems {
				reported[p.Key] = true
			}
			for _, p := range err.(*Error).Problems {
				if reported[p.Key] {
					// The value could not be read (and the default was
					// kept); that problem says it already.
					continue
				}
				// Point at the key in the file and quote it as written.
				if n, ok := written.nodes[p.Key]; ok {
					p.Line, p.Column = written.lines.position(n.off)
					if n.kind != kObject && n.kind != kArray {
						p.Value = n.raw
					}
				}
				problems = append(problems, p)
			}
		}
	}
	if len(problems) > 0 {
		// File order first; problems with no place in the file (values
		// from the environment, defaults that break a rule) last.
		sort.SliceStable(problems, func(i, j int) bool {
			pi, pj := problems[i], problems[j]
			if (pi.Line == 0) != (pj.Line == 0) {
				return pj.Line == 0
			}
			return pi.Line < pj.Line || pi.Line == pj.Line && pi.Column < pj.Column
		})
		return nil, &Error{Problems: problems}
	}
	return c, nil
}

// written records what a file set: the value node of every dotted key
// written (not null), and the line index of the text they point into.
type written struct {
	nodes map[string]*node
	lines lineIndex
}

// decode builds the Config for data without running Validate. A nil Config
// means the text was not a JSON object.
func decode(data []byte) (*Config, []Problem, written) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // editors on Windows add a BOM
	root, syn := buildTree(data)
	if syn != nil {
		return nil, []Problem{*syn}, written{}
	}
	if root.kind != kObject {
		line, col := position(data, root.off)
		return nil, []Problem{{Msg: "a config must be a JSON object, not " + root.kind.String(), Line: line, Column: col}}, written{}
	}
	c := defaults()
	specs := schema(c)
	d := &decoder{c: c, lines: newLineIndex(data), set: map[string]*node{}, index: keyIndex(specs)}
	d.object(root, "", specs)
	d.resolve()
	if len(d.ignored) > 0 {
		d.c.Ignored = d.ignored
		d.warnings = append(d.warnings, "ignored (DeepSpeed key not used by zinf): "+strings.Join(d.ignored, ", "))
	}
	d.c.Warnings = d.warnings
	return d.c, d.problems, written{nodes: d.set, lines: d.lines}
}

// decoder carries the state of one decode.
type decoder struct {
	c        *Config
	lines    lineIndex // positions of problems, in one pass over the text
	problems []Problem
	warnings []string
	ignored  []string
	set      map[string]*node    // dotted key -> its value, for keys written in the file
	deferred []func()            // readers' effects that depend on keys read later
	index    map[string][]string // key name -> dotted paths of every known key with that name
	known    map[string]*keySet  // section path -> its known keys, for suggestions
}

// reader reads the value n of the dotted key into the Config under decode,
// or records a problem.
type reader = func(d *decoder, n *node, key string)

// spec describes one key of the schema.
type spec struct {
	name string
	// set reads a leaf value. It is not called for JSON null, which means
	// "use the default" everywhere.
	set reader
	// fields are the keys of a section read strictly; walked when set is
	// nil, and listed for suggestions either way.
	fields []spec
	// ignored marks a DeepSpeed key zinf accepts without acting on it; its
	// value is checked only for DeepSpeed's type (ignoredTypes) and
	// bounded strings.
	ignored bool
}

func leaf(name string, set reader) spec {
	return spec{name: name, set: set}
}

func section(name string, fields ...spec) spec { return spec{name: name, fields: fields} }

func ignore(names ...string) []spec {
	out := make([]spec, len(names))
	for i, n := range names {
		out[i] = spec{name: n, ignored: true}
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// object walks an object node against specs.
func (d *decoder) object(n *node, path string, specs []spec) {
	if n.kind == kNull {
		return
	}
	if n.kind != kObject {
		d.typeProblem(n, path, kObject.String())
		return
	}
	seen := make(map[string]bool, len(n.members))
	for i, m := range n.members {
		if len(d.problems) == cap(d.problems) {
			// Growing by the members left, each of which may be a
			// problem, instead of append's quarter at a time: a file of
			// many unknown keys allocated its problems five times over.
			d.problems = slices.Grow(d.problems, len(n.members)-i)
		}
		key := join(path, m.key)
		if seen[m.key] {
			d.problemAt(m.keyOff, Problem{Key: key, Msg: "is written more than once"})
			continue
		}
		seen[m.key] = true
		s := findSpec(specs, m.key)
		if s == nil {
			d.unknown(m, path, specs)
			continue
		}
		if m.val.kind != kNull {
			d.set[key] = m.val
		}
		switch {
		case s.ignored:
			d.ignored = append(d.ignored, key)
			d.checkIgnored(m.val, key, m.key)
		case s.set != nil:
			if m.val.kind != kNull {
				s.set(d, m.val, key)
			}
		default:
			d.object(m.val, key, s.fields)
		}
	}
}

func findSpec(specs []spec, name string) *spec {
	for i := range specs {
		if specs[i].name == name {
			return &specs[i]
		}
	}
	return nil
}

// unknown reports a key no schema knows, with the closest known key.
func (d *decoder) unknown(m member, path string, specs []spec) {
	p := Problem{Key: join(path, m.key), Msg: "unknown key"}
	known := d.candidates(path, specs)
	if best := known.closest(m.key); best != "" {
		p.Msg += fmt.Sprintf(" (did you mean %q?)", join(path, best))
	} else if elsewhere := d.index[m.key]; len(elsewhere) > 0 {
		p.Msg += fmt.Sprintf(" here (did you mean %q?)", elsewhere[0])
	} else if len(known.names) <= 16 {
		p.Allowed = strings.Join(known.names, ", ")
	}
	d.problemAt(m.keyOff, p)
}

// candidates returns the known keys of the section at path, prepared for
// suggestions once per section (a file may hold many unknown keys).
func (d *decoder) candidates(path string, specs []spec) *keySet {
	if k, ok := d.known[path]; ok {
		return k
	}
	k := &keySet{names: make([]string, len(specs)), norms: make([]string, len(specs)), runes: make([]int, len(specs)), chars: make([]charSet, len(specs))}
	for i, s := range specs {
		k.names[i], k.norms[i] = s.name, normKey(s.name)
		k.runes[i], k.chars[i] = utf8.RuneCountInString(s.name), charsOf(s.name)
	}
	k.all = charsOf(strings.Join(k.names, "") + strings.Join(k.norms, ""))
	if d.known == nil {
		d.known = map[string]*keySet{}
	}
	d.known[path] = k
	return k
}

func (d *decoder) problemAt(off int, p Problem) {
	p.Line, p.Column = d.lines.position(off)
	d.problems = append(d.problems, p)
}

func (d *decoder) valueProblem(n *node, key, msg, allowed string) {
	d.problemAt(n.off, Problem{Key: key, Value: n.raw, Msg: msg, Allowed: allowed})
}

func (d *decoder) typeProblem(n *node, key, want string) {
	d.valueProblem(n, key, "is "+n.kind.String()+", not "+want, allowedFor(key))
}

func (d *decoder) warn(format string, args ...any) {
	d.warnings = append(d.warnings, fmt.Sprintf(format, args...))
}

// isAuto reports whether n is the string "auto", which Hugging Face's
// DeepSpeed integration replaces before DeepSpeed reads the file. zinf reads
// it as "the default" and says so.
func (d *decoder) isAuto(n *node, key, def string) bool {
	if n.kind == kString && n.str == "auto" {
		d.warn(`%s: "auto" is filled in by the Hugging Face integration; zinf uses its default %s`, key, def)
		return true
	}
	return false
}

// integral reads a JSON number that must be a whole number in [lo, hi]. It
// accepts exponent forms (1e9), as DeepSpeed configs use them for counts.
func (d *decoder) integral(n *node, key string, lo, hi int64) (int64, bool) {
	if n.kind != kNumber {
		d.typeProblem(n, key, "an integer")
		return 0, false
	}
	r, err := parseDecimal(n.str)
	if err == errSizeRange {
		d.valueProblem(n, key, "is out of range", "")
		return 0, false
	}
	if err != nil || !r.IsInt() {
		d.valueProblem(n, key, "is not an integer", "")
		return 0, false
	}
	if !r.Num().IsInt64() || r.Num().Int64() < lo || r.Num().Int64() > hi {
		allowed := allowedFor(key)
		if allowed == "" {
			allowed = rangeText(lo, hi)
		}
		d.valueProblem(n, key, "is out of range", allowed)
		return 0, false
	}
	return r.Num().Int64(), true
}

func rangeText(lo, hi int64) string {
	switch {
	case hi == math.MaxInt64 || hi == math.MaxInt32:
		return fmt.Sprintf(">= %d", lo)
	default:
		return fmt.Sprintf("%d..%d", lo, hi)
	}
}

// The readers below store a value when it has the right type and leave the
// default in place otherwise; range and enum checks belong to Validate, so
// that a Config built in code is checked the same way.

func intInto(p *int) reader {
	return func(d *decoder, n *node, key string) {
		if v, ok := d.integral(n, key, math.MinInt32, math.MaxInt32); ok {
			*p = int(v)
		}
	}
}

func countInto(p *int64) reader {
	return func(d *decoder, n *node, key string) {
		if v, ok := d.integral(n, key, math.MinInt64, math.MaxInt64); ok {
			*p = v
		}
	}
}

func sizeInto(p *Size) reader {
	return func(d *decoder, n *node, key string) {
		const allowed = `a byte count: a number or a string such as "64MiB", "4GiB", "1.5GB"`
		var v int64
		var err error
		switch n.kind {
		case kNumber:
			v, err = parseSize(n.str)
		case kString:
			v, err = parseSize(n.str)
		default:
			d.valueProblem(n, key, "is "+n.kind.String()+", not a size", allowed)
			return
		}
		switch err {
		case nil:
			*p = Size(v)
		case errSizeRange:
			d.valueProblem(n, key, "is out of range", ">= 0 and < 8EiB")
		case errSizeFraction:
			d.valueProblem(n, key, "is not a whole number of bytes", "")
		default:
			d.valueProblem(n, key, "is not a size", allowed)
		}
	}
}

func boolInto(p *bool) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kBool {
			d.typeProblem(n, key, "a boolean (true or false)")
			return
		}
		*p = n.b
	}
}

func floatInto(p *float64) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kNumber {
			d.typeProblem(n, key, "a number")
			return
		}
		v, err := strconv.ParseFloat(n.str, 64)
		if err != nil {
			d.valueProblem(n, key, "is out of range", "a finite number")
			return
		}
		*p = v
	}
}

func stringInto[T ~string](p *T) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kString {
			d.typeProblem(n, key, "a string")
			return
		}
		*p = T(n.str)
	}
}

// accumulationSteps reads gradient_accumulation_steps: a number, the
// user's micro-batches per step, or "auto", which lets the planner pick
// them (Config.GradientAccumulationAuto). Unlike the other "auto" values
// it is no stand-in for a default, so it is not warned about.
func accumulationSteps(c *Config) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind == kString && n.str == "auto" {
			c.GradientAccumulationSteps, c.GradientAccumulationAuto = 1, true
			return
		}
		c.GradientAccumulationAuto = false
		intInto(&c.GradientAccumulationSteps)(d, n, key)
	}
}

// pipelineDepth reads zinf.pipeline_depth: a number, the optimizer's
// depth as given, or "auto" (Config's default), which lets the planner
// raise it for small sub-groups (Zinf.PipelineDepthAuto).
func pipelineDepth(c *Config) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind == kString && n.str == "auto" {
			c.Zinf.PipelineDepth, c.Zinf.PipelineDepthAuto = 1, true
			return
		}
		if n.kind == kString {
			d.typeProblem(n, key, `a number 0..16 or "auto"`)
			return
		}
		c.Zinf.PipelineDepthAuto = false
		intInto(&c.Zinf.PipelineDepth)(d, n, key)
	}
}

// autoable wraps a reader so that it also accepts Hugging Face's "auto".
func autoable(def string, read reader) reader {
	return func(d *decoder, n *node, key string) {
		if !d.isAuto(n, key, def) {
			read(d, n, key)
		}
	}
}

// stringsInto reads an array of strings.
func stringsInto(p *[]string) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kArray {
			d.typeProblem(n, key, "an array of strings")
			return
		}
		out := make([]string, 0, len(n.elems))
		ok := true
		for i, e := range n.elems {
			if e.kind != kString {
				d.typeProblem(e, fmt.Sprintf("%s[%d]", key, i), "a string")
				ok = false
				continue
			}
			d.set[fmt.Sprintf("%s[%d]", key, i)] = e
			out = append(out, e.str)
		}
		if ok {
			if len(out) == 0 {
				out = nil // [] and absent mean the same
			}
			*p = out
		}
	}
}

// mustBool accepts a DeepSpeed switch zinf does not implement, as long as it
// holds the one value zinf behaves as.
func mustBool(want bool, why string) reader {
	return func(d *decoder, n *node, key string) {
		var v bool
		boolInto(&v)(d, n, key)
		if n.kind == kBool && v != want {
			d.valueProblem(n, key, why, strconv.FormatBool(want))
		}
	}
}

// schema returns the keys zinf knows, with readers that fill c. It is built
// per decode because the readers close over the Config being filled.
func schema(c *Config) []spec {
	offloadParam := section("offload_param",
		leaf("device", stringInto(&c.ZeroOptimization.OffloadParam.Device)),
		leaf("nvme_path", stringInto(&c.ZeroOptimization.OffloadParam.NVMePath)),
		leaf("buffer_count", intInto(&c.ZeroOptimization.OffloadParam.BufferCount)),
		leaf("buffer_size", countInto(&c.ZeroOptimization.OffloadParam.BufferSize)),
		leaf("max_in_cpu", countInto(&c.ZeroOptimization.OffloadParam.MaxInCPU)),
		leaf("pin_memory", boolInto(&c.ZeroOptimization.OffloadParam.PinMemory)),
	)
	offloadOptimizer := section("offload_optimizer",
		leaf("device", stringInto(&c.ZeroOptimization.OffloadOptimizer.Device)),
		leaf("nvme_path", stringInto(&c.ZeroOptimization.OffloadOptimizer.NVMePath)),
		leaf("buffer_count", intInto(&c.ZeroOptimization.OffloadOptimizer.BufferCount)),
		leaf("pin_memory", boolInto(&c.ZeroOptimization.OffloadOptimizer.PinMemory)),
		leaf("pipeline_read", boolInto(&c.ZeroOptimization.OffloadOptimizer.PipelineRead)),
		leaf("pipeline_write", boolInto(&c.ZeroOptimization.OffloadOptimizer.PipelineWrite)),
		leaf("fast_init", boolInto(&c.ZeroOptimization.OffloadOptimizer.FastInit)),
		leaf("ratio", floatInto(&c.ZeroOptimization.OffloadOptimizer.Ratio)),
	)
	zero := append([]spec{
		leaf("stage", intInto(&c.ZeroOptimization.Stage)),
		leaf("sub_group_size", countInto(&c.ZeroOptimization.SubGroupSize)),
		offloadParam,
		offloadOptimizer,
		// Deprecated spellings of the offload sections, read as DeepSpeed does.
		leaf("cpu_offload", deprecatedOffload("offload_optimizer")),
		leaf("cpu_offload_param", deprecatedOffload("offload_param")),
		leaf("cpu_offload_use_pin_memory", deprecatedPin),
	}, ignore(
		"contiguous_gradients", "overlap_comm", "reduce_scatter", "reduce_bucket_size",
		"allgather_partitions", "allgather_bucket_size", "use_multi_rank_bucket_allreduce",
		"load_from_fp32_weights", "elastic_checkpoint", "round_robin_gradients",
		"ignore_unused_parameters", "legacy_stage1",
		"stage3_prefetch_bucket_size", "prefetch_bucket_size",
		"stage3_param_persistence_threshold", "param_persistence_threshold",
		"stage3_model_persistence_threshold", "model_persistence_threshold",
		"stage3_max_live_parameters", "max_live_parameters",
		"stage3_max_reuse_distance", "max_reuse_distance",
		"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
		"stage3_gather_fp16_weights_on_model_save",
		"stage3_module_granularity_threshold", "module_granularity_threshold",
		"stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
		"zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
		"zero_quantized_gradients", "zeropp_loco_param", "mics_shard_size",
		"mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
		"override_module_apply", "log_trace_cache_warnings",
	)...)

	aio := section("aio",
		leaf("block_size", sizeInto(&c.AIO.BlockSize)),
		leaf("queue_depth", intInto(&c.AIO.QueueDepth)),
		leaf("intra_op_parallelism", intInto(&c.AIO.IntraOpParallelism)),
		leaf("thread_count", threadCount),
		leaf("single_submit", boolInto(&c.AIO.SingleSubmit)),
		leaf("overlap_events", boolInto(&c.AIO.OverlapEvents)),
		leaf("use_gds", boolInto(&c.AIO.UseGDS)),
	)

	optimizer := spec{name: "optimizer", set: optimizerSection(c), fields: optimizerSpecs(c)}

	fp16 := section("fp16", append(append([]spec{
		leaf("enabled", autoable("false", boolInto(&c.FP16))),
	}, lossScalingSpecs(c)...), ignore("auto_cast", "fused_mode", "fp16_master_weights_and_grads")...)...)
	bf16Fields := append([]spec{
		leaf("enabled", autoable("false", boolInto(&c.BF16))),
	}, ignore("immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
		"bf16_optimizer_states")...)
	bf16 := section("bf16", bf16Fields...)
	bfloat16 := spec{name: "bfloat16", set: func(d *decoder, n *node, key string) {
		d.warn("bfloat16 is DeepSpeed's old name for bf16; read as bf16")
		d.object(n, key, bf16Fields)
	}}

	zinf := section("zinf",
		section("tiers",
			leaf("gpu_bytes", sizeInto(&c.Zinf.Tiers.GPUBytes)),
			leaf("cpu_pinned_bytes", sizeInto(&c.Zinf.Tiers.CPUPinnedBytes)),
		),
		leaf("nvme_paths", stringsInto(&c.Zinf.NVMePaths)),
		leaf("checksums", boolInto(&c.Zinf.Checksums)),
		leaf("direct", stringInto(&c.Zinf.Direct)),
		leaf("backend", stringInto(&c.Zinf.Backend)),
		leaf("pipeline_depth", pipelineDepth(c)),
		leaf("gds", stringInto(&c.Zinf.GDS)),
		leaf("device", stringInto(&c.Zinf.Device)),
		leaf("rank", intInto(&c.Zinf.Rank)),
		leaf("world_size", intInto(&c.Zinf.WorldSize)),
		leaf("swap_file_bytes", sizeInto(&c.Zinf.SwapFileBytes)),
		leaf("preallocate", boolInto(&c.Zinf.Preallocate)),
		leaf("piece_bytes", sizeInto(&c.Zinf.PieceBytes)),
		leaf("prefetch_depth", intInto(&c.Zinf.PrefetchDepth)),
		leaf("optimizer_workers", intInto(&c.Zinf.OptimizerWorkers)),
		leaf("optimizer_states", stringInto(&c.Zinf.OptimizerStates)),
		leaf("optimizer_states_fp32", stringsInto(&c.Zinf.OptimizerStatesFP32)),
		leaf("speculate", stringInto(&c.Zinf.Speculate)),
		leaf("pinned_grads", stringInto(&c.Zinf.PinnedGrads)),
		leaf("overlap_update", boolInto(&c.Zinf.OverlapUpdate)),
		leaf("schedule", stringInto(&c.Zinf.Schedule)),
		section("bandwidth",
			leaf("read_bytes_per_sec", sizeInto(&c.Zinf.Bandwidth.ReadBytesPerSec)),
			leaf("write_bytes_per_sec", sizeInto(&c.Zinf.Bandwidth.WriteBytesPerSec)),
			leaf("file", stringInto(&c.Zinf.Bandwidth.File)),
			leaf("probe", boolInto(&c.Zinf.Bandwidth.Probe)),
			leaf("probe_bytes", sizeInto(&c.Zinf.Bandwidth.ProbeBytes)),
		),
		leaf("nvme_tbw", sizeInto(&c.Zinf.NVMeTBW)),
		section("kv_cache",
			leaf("device", stringInto(&c.Zinf.KVCache.Device)),
			leaf("bytes", sizeInto(&c.Zinf.KVCache.Bytes)),
		),
		section("activations",
			leaf("device", stringInto(&c.Zinf.Activations.Device)),
			leaf("memory_bytes", sizeInto(&c.Zinf.Activations.MemoryBytes)),
			leaf("cpu_bytes", sizeInto(&c.Zinf.Activations.CPUBytes)),
		),
		leaf("pinned_stall_timeout", durationInto(&c.Zinf.PinnedStallTimeout)),
		leaf("comm_stall_timeout", durationInto(&c.Zinf.CommStallTimeout)),
		leaf("comm_heartbeat_timeout", durationInto(&c.Zinf.CommHeartbeatTimeout)),
	)

	return append([]spec{
		{name: "zero_optimization", set: zeroSection(zero), fields: zero},
		aio,
		optimizer,
		fp16,
		bf16,
		bfloat16,
		leaf("gradient_accumulation_steps", accumulationSteps(c)),
		leaf("train_micro_batch_size_per_gpu", autoable("1", intInto(&c.MicroBatch))),
		leaf("gradient_clipping", autoable("0 (no clipping)", floatInto(&c.GradientClipping))),
		{name: "scheduler", set: schedulerSection(c), fields: schedulerSpecs(c)},
		zinf,
		section("activation_checkpointing", append([]spec{leaf("cpu_checkpointing", boolInto(&c.CPUCheckpointing))},
			ignore("partition_activations", "contiguous_memory_optimization", "number_checkpoints", "synchronize_checkpoint_boundary", "profile")...)...),
	}, ignore(
		// DeepSpeed's other top-level keys, accepted whole: zinf runs its own
		// training loop, so batch bookkeeping, logging, monitors and
		// communication settings have nothing to act on.
		"train_batch_size", "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state",
		"prescale_gradients", "gradient_predivide_factor",
		"sparse_gradients", "fp32_allreduce", "communication_data_type", "seq_parallel_comm_data_type",
		"disable_allgather", "amp", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
		"tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler",
		"sparse_attention", "eigenvalue", "progressive_layer_drop",
		"curriculum_learning", "data_efficiency", "compression_training", "checkpoint", "data_types",
		"dataloader_drop_last", "elasticity", "autotuning", "pipeline", "nebula", "hybrid_engine",
		"graph_harvesting", "use_data_before_expert_parallelism", "vocabulary_size", "quantize_training",
		"weight_quantization", "compile", "timers", "torch_autocast", "tensor_parallel",
		"sequence_parallel_size", "gradient_accumulation_dtype", "train_batch_size_per_gpu",
		"mp_size", "zenflow",
	)...)
}

// zeroSection reads "zero_optimization", which DeepSpeed also accepts in an
// old form: a bare boolean meaning stage 1 (true) or 0 (false).
func zeroSection(fields []spec) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind == kBool {
			stage := 0
			if n.b {
				stage = 1
			}
			d.c.ZeroOptimization.Stage = stage
			d.warn(`zero_optimization: a boolean is DeepSpeed's deprecated form; read as {"stage": %d}`, stage)
			return
		}
		d.object(n, key, fields)
	}
}

// deprecatedOffload reads DeepSpeed's old "cpu_offload" / "cpu_offload_param"
// switches: true means the section's device is cpu, unless the section
// itself is written (then the section wins, as in DeepSpeed).
func deprecatedOffload(sectionName string) reader {
	return func(d *decoder, n *node, key string) {
		var on bool
		boolInto(&on)(d, n, key)
		if n.kind != kBool {
			return
		}
		d.warn("%s is deprecated; read as zero_optimization.%s.device %q (write that instead)",
			key, sectionName, map[bool]string{true: "cpu", false: "none"}[on])
		d.deferred = append(d.deferred, func() {
			if _, written := d.set["zero_optimization."+sectionName]; written || !on {
				return
			}
			if sectionName == "offload_param" {
				d.c.ZeroOptimization.OffloadParam.Device = OffloadCPU
			} else {
				d.c.ZeroOptimization.OffloadOptimizer.Device = OffloadCPU
			}
		})
	}
}

// deprecatedPin reads "cpu_offload_use_pin_memory": pin_memory for the
// offload sections that do not set it themselves.
func deprecatedPin(d *decoder, n *node, key string) {
	var pin bool
	boolInto(&pin)(d, n, key)
	if n.kind != kBool {
		return
	}
	d.warn("%s is deprecated; read as pin_memory %t of the offload sections (write that instead)", key, pin)
	d.deferred = append(d.deferred, func() {
		z := &d.c.ZeroOptimization
		if _, ok := d.set["zero_optimization.offload_param.pin_memory"]; !ok {
			z.OffloadParam.PinMemory = pin
		}
		if _, ok := d.set["zero_optimization.offload_optimizer.pin_memory"]; !ok {
			z.OffloadOptimizer.PinMemory = pin
		}
	})
}

// threadCount reads aio.thread_count, DeepSpeed's old name for
// intra_op_parallelism.
func threadCount(d *decoder, n *node, key string) {
	v, ok := d.integral(n, key, math.MinInt32, math.MaxInt32)
	if !ok {
		return
	}
	d.warn("aio.thread_count is DeepSpeed's old name for aio.intra_op_parallelism; read as intra_op_parallelism %d", v)
	d.deferred = append(d.deferred, func() {
		if _, both := d.set["aio.intra_op_parallelism"]; !both {
			d.c.AIO.IntraOpParallelism = int(v)
		}
	})
}

// optimizerType reads "optimizer.type" case-insensitively, as DeepSpeed
// does, and stores zinf's spelling.
func optimizerType(d *decoder, n *node, key string) {
	if n.kind != kString {
		d.typeProblem(n, key, "a string")
		return
	}
	switch strings.ToLower(n.str) {
	case "adam":
		d.c.Optimizer.Type = OptimizerAdam
	case "adamw":
		d.c.Optimizer.Type = OptimizerAdamW
	case "sgd":
		d.c.Optimizer.Type = OptimizerSGD
	case "adagrad":
		d.c.Optimizer.Type = OptimizerAdagrad
	case "lion":
		d.c.Optimizer.Type = OptimizerLion
	default:
		// Keep it, so Validate reports it with the allowed values.
		d.c.Optimizer.Type = OptimizerType(n.str)
	}
}

// betasInto reads [beta1, beta2].
func betasInto(p *[2]float64) reader {
	return func(d *decoder, n *node, key string) {
		if n.kind != kArray || len(n.elems) != 2 {
			d.valueProblem(n, key, "is not a pair of numbers", "[beta1, beta2], each in [0, 1)")
			return
		}
		var v [2]float64
		before := len(d.problems)
		for i, e := range n.elems {
			elemKey := fmt.Sprintf("%s[%d]", key, i)
			d.set[elemKey] = e
			floatInto(&v[i])(d, e, elemKey)
		}
		if len(d.problems) == before {
			*p = v
		}
	}
}

// resolve applies the rules that depend on more than one key or on the
// environment, after every key has been read.
func (d *decoder) resolve() {
	for _, f := range d.deferred {
		f()
	}
	d.resolveTraining()
	c := d.c
	oo := c.ZeroOptimization.OffloadOptimizer
	if _, ok := d.set["zinf.pipeline_depth"]; !ok {
		_, r := d.set["zero_optimization.offload_optimizer.pipeline_read"]
		_, w := d.set["zero_optimization.offload_optimizer.pipeline_write"]
		if r && w && !oo.PipelineRead && !oo.PipelineWrite {
			c.Zinf.PipelineDepth, c.Zinf.PipelineDepthAuto = 0, false
		}
	}
	if _, ok := d.set["zinf.gds"]; !ok {
		if c.AIO.UseGDS {
			c.Zinf.GDS = GDSAuto
		}
	} else if c.AIO.UseGDS && c.Zinf.GDS == GDSOff {
		d.warn(`aio.use_gds is true but zinf.gds is "off": GPUDirect Storage is not used`)
	}
	// Rank and world size from the launcher: the first launcher whose
	// variables are set, both from it (never a rank from one launcher
	// and a size from another).
	for _, l := range Launchers {
		r := strings.TrimSpace(os.Getenv(l.RankEnv)) != ""
		w := strings.TrimSpace(os.Getenv(l.SizeEnv)) != ""
		if r || w {
			d.fromEnv("zinf.rank", l.RankEnv, &c.Zinf.Rank)
			d.fromEnv("zinf.world_size", l.SizeEnv, &c.Zinf.WorldSize)
			break
		}
	}
	if len(c.Zinf.NVMePaths) > 0 {
		z := c.ZeroOptimization
		for _, p := range []struct {
			key, path string
			dev       OffloadDevice
		}{
			{"zero_optimization.offload_param.nvme_path", z.OffloadParam.NVMePath, z.OffloadParam.Device},
			{"zero_optimization.offload_optimizer.nvme_path", z.OffloadOptimizer.NVMePath, z.OffloadOptimizer.Device},
		} {
			if p.dev == OffloadNVMe && p.path != "" && !contains(c.Zinf.NVMePaths, p.path) {
				d.warn("%s %q is not used: zinf.nvme_paths takes precedence", p.key, p.path)
			}
		}
	}
	for _, pair := range [][2]string{{"bfloat16", "bf16"}, {"aio.thread_count", "aio.intra_op_parallelism"}} {
		if n, both := d.set[pair[0]]; both {
			if _, ok := d.set[pair[1]]; ok {
				d.valueProblem(n, pair[0], "is the old name of "+pair[1]+"; write only "+pair[1], "")
			}
		}
	}
}

// Launcher is a job launcher's pair of environment variables giving a
// process its rank and the world size.
type Launcher struct {
	Name             string
	RankEnv, SizeEnv string
}

// Launchers are the launchers whose variables fill zinf.rank and
// zinf.world_size when the file does not set them, in this order:
// torchrun and the DeepSpeed launcher (RANK, WORLD_SIZE), Open MPI's
// mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), Slurm's srun
// (SLURM_PROCID, SLURM_NTASKS).
var Launchers = []Launcher{
	{"torchrun", "RANK", "WORLD_SIZE"},
	{"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
	{"srun", "SLURM_PROCID", "SLURM_NTASKS"},
}

// fromEnv fills an integer the file did not set from an environment
// variable, as launchers export RANK and WORLD_SIZE (see Launchers).
func (d *decoder) fromEnv(key, env string, p *int) {
	if _, ok := d.set[key]; ok {
		return
	}
	s, ok := os.LookupEnv(env)
	if !ok || strings.TrimSpace(s) == "" {
		return
	}
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < 0 || v > math.MaxInt32 {
		// Kept on the Config so that Validate reports it, for Default too.
		d.c.envProblems = append(d.c.envProblems, Problem{Key: key, Value: strconv.Quote(s),
			Msg: "(from $" + env + ") is not a non-negative integer"})
		return
	}
	*p = v
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// keyIndex maps each key name to the dotted paths where the schema has it,
// for suggesting the right section for a key written in the wrong one.
func keyIndex(specs []spec) map[string][]string {
	idx := map[string][]string{}
	var walk func(path string, specs []spec)
	walk = func(path string, specs []spec) {
		for _, s := range specs {
			p := join(path, s.name)
			idx[s.name] = append(idx[s.name], p)
			walk(p, s.fields)
		}
	}
	walk("", specs)
	return idx
}

// keySet is a section's known keys, and each in normKey's form.
type keySet struct {
	names, norms []string
	runes        []int     // each name's length in runes
	chars        []charSet // the bytes each name holds
	all          charSet   // the bytes any name or its normal form holds
}

// charSet is the set of bytes a string holds, for a lower bound of the
// edit distance: every byte of one string that the other does not hold
// costs an edit of its own (a substitution or a deletion; transpositions
// only move bytes). Only ASCII strings get a set (ok); the others are
// compared without this bound.
type charSet struct {
	bits [2]uint64
	ok   bool // the string is ASCII
}

func charsOf(s string) charSet {
	var c charSet
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return charSet{}
		}
		c.bits[s[i]>>6] |= 1 << (s[i] & 63)
	}
	c.ok = true
	return c
}

// absentFrom counts the distinct bytes of c that o does not hold: a lower
// bound of missing, in constant time.
func (c charSet) absentFrom(o charSet) int {
	return bits.OnesCount64(c.bits[0]&^o.bits[0]) + bits.OnesCount64(c.bits[1]&^o.bits[1])
}

// missing counts the bytes of ASCII string s that c does not hold: a lower
// bound of the edit distance between s and the string of c (both ASCII).
func (c charSet) missing(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if c.bits[s[i]>>6]&(1<<(s[i]&63)) == 0 {
			n++
		}
	}
	return n
}

// closest returns the known key nearest to key, or "" when none is near
// enough to be a likely typo. Case, '-' and '_' differences count as near.
// It is called once per unknown key, so it skips the edit distance of keys
// whose length alone puts them too far.
func (k *keySet) closest(key string) string {
	if len(key) > 64 {
		return ""
	}
	nk := normKey(key)
	lower := strings.ToLower(key)
	runes := utf8.RuneCountInString(lower)
	ascii := isASCII(lower)
	keyChars := charsOf(lower)
	limit := min(max(len(key)/3, 1), 3)
	best, bestDist := "", limit+1
	if ascii && k.all.ok && k.all.missing(lower) >= bestDist && k.all.missing(nk) > 0 {
		// More of the key's bytes than the limit are in no name (so
		// missing from each), and its normal form holds one that no
		// normal form holds: nothing is near.
		return ""
	}
	for i, c := range k.names {
		if k.norms[i] == nk {
			return c
		}
		// The distance is at least the difference in length, and at least
		// the bytes of the key the name does not hold: most keys of a
		// file of many unknown keys are ruled out by these alone.
		if d := runes - k.runes[i]; d >= bestDist || -d >= bestDist {
			continue
		}
		if ascii && k.chars[i].ok && (keyChars.absentFrom(k.chars[i]) >= bestDist || k.chars[i].missing(lower) >= bestDist) {
			continue
		}
		if dist := editDistance(lower, c, bestDist-1); dist < bestDist {
			best, bestDist = c, dist
		}
	}
	return best
}

// normKey lowercases s and drops '_', '-' and ' ', for comparing keys
// that differ only in those.
func normKey(s string) string {
	s = strings.ToLower(s)
	if !strings.ContainsAny(s, "_- ") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if c := s[i]; c != '_' && c != '-' && c != ' ' {
			b = append(b, c)
		}
	}
	return string(b)
}

// editDistance is the optimal-string-alignment distance: insertions,
// deletions, substitutions and transpositions of neighbours each cost 1.
// Past bound it stops early and returns bound+1: only "near enough"
// matters to a suggestion, and a file may hold many unknown keys.
func editDistance(a, b string, bound int) int {
	if isASCII(a) && isASCII(b) {
		return osa([]byte(a), []byte(b), bound)
	}
	return osa([]rune(a), []rune(b), bound)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func osa[T byte | rune](a, b []T, bound int) int {
	var rows [3][66]int // keys are short: no allocation below 66
	var prev2, prev, cur []int
	if len(b)+1 <= len(rows[0]) {
		prev2, prev, cur = rows[0][:len(b)+1], rows[1][:len(b)+1], rows[2][:len(b)+1]
	} else {
		prev2, prev, cur = make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	}
	for j := range prev {
		prev[j] = j
	}
	prevOver := false
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
			rowMin = min(rowMin, cur[j])
		}
		// Every later entry derives from this row or the one before (a
		// transposition): once both exceed bound, so does the result.
		over := rowMin > bound
		if over && prevOver {
			return bound + 1
		}
		prevOver = over
		prev2, prev, cur = prev, cur, prev2
	}
	return min(prev[len(b)], bound+1)
}
