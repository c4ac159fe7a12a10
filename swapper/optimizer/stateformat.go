package optimizer

import (
	"fmt"
	"strings"
)

// StateEncoding is how an optimizer state (a moment) is stored: the master
// weight is always fp32, its states may be narrower.
type StateEncoding int

// The encodings.
const (
	// EncodingFP32 keeps each state element as a float32 (4 bytes).
	EncodingFP32 StateEncoding = iota
	// EncodingBF16 keeps each state element as a bfloat16 (2 bytes), rounded
	// to nearest even from the float32 the update computes
	// (buffers.BFloat16FromFloat32).
	EncodingBF16
	// EncodingBlockwise8 keeps each state element as one byte, an index into
	// a 256-entry dynamic quantization map (SignedDynamicMap for exp_avg,
	// UnsignedDynamicMap for exp_avg_sq), and one float32 absmax per block
	// of StateFormat.BlockSize elements (QuantMap).
	EncodingBlockwise8
)

// Blockwise8BlockSize is the block size of EncodingBlockwise8: one fp32
// absmax per 256 elements of a state. 256 is what bitsandbytes' blockwise
// 8-bit optimizers allocate (one absmax per 256 elements of each state;
// some older releases used 2048) and torchao's 8-bit optimizers default
// to, so their published convergence results are for this granularity. A
// smaller block also confines an outlier's loss of precision to fewer
// elements, costs 4/256 = 1.6% more state bytes than 2048 would (0.016
// bytes per element) and keeps a block's two dequantized moments (2 KiB)
// in the L1 cache between the update and the requantization of the same
// pass.
const Blockwise8BlockSize = 256

// StateFormat describes how the states of a record are stored. The zero
// StateFormat is fp32, today's format.
type StateFormat struct {
	Encoding StateEncoding
	// BlockSize is the elements per absmax of EncodingBlockwise8 (0 means
	// Blockwise8BlockSize, the only size supported); it must be 0 for
	// the other kinds.
	BlockSize int
}

// The state formats by name (ParseStateFormat).
var (
	FormatFP32       = StateFormat{Encoding: EncodingFP32}
	FormatBF16       = StateFormat{Encoding: EncodingBF16}
	FormatBlockwise8 = StateFormat{Encoding: EncodingBlockwise8, BlockSize: Blockwise8BlockSize}
)

// stateFormatNames are the names ParseStateFormat accepts, in order.
var stateFormatNames = []string{"fp32", "bf16", "8bit"}

// ParseStateFormat returns the format named s: "fp32", "bf16" or "8bit"
// (8-bit blockwise, Blockwise8BlockSize elements per absmax). Any other
// name is an error listing those.
func ParseStateFormat(s string) (StateFormat, error) {
	switch strings.TrimSpace(s) {
	case "fp32":
		return FormatFP32, nil
	case "bf16":
		return FormatBF16, nil
	case "8bit":
		return FormatBlockwise8, nil
	}
	return StateFormat{}, fmt.Errorf("optimizer: state format %q: allowed: %s", s, strings.Join(stateFormatNames, ", "))
}

// String returns the name ParseStateFormat takes ("fp32", "bf16",
// "8bit"), or a description of an invalid format.
func (f StateFormat) String() string {
	if f.Validate() != nil {
		return fmt.Sprintf("StateFormat{Encoding: %d, BlockSize: %d}", int(f.Encoding), f.BlockSize)
	}
	return stateFormatNames[f.Encoding]
}

// Validate reports a format that is not one of the supported ones.
func (f StateFormat) Validate() error {
	switch f.Encoding {
	case EncodingFP32, EncodingBF16:
		if f.BlockSize != 0 {
			return fmt.Errorf("optimizer: StateFormat.BlockSize = %d: only 8-bit blockwise states have blocks (must be 0 for %s)", f.BlockSize, stateFormatNames[f.Encoding])
		}
		return nil
	case EncodingBlockwise8:
		if f.BlockSize != 0 && f.BlockSize != Blockwise8BlockSize {
			return fmt.Errorf("optimizer: StateFormat.BlockSize = %d: 8-bit blockwise states use blocks of %d elements", f.BlockSize, Blockwise8BlockSize)
		}
		return nil
	}
	return fmt.Errorf("optimizer: StateFormat.Encoding = %d: must be EncodingFP32, EncodingBF16 or EncodingBlockwise8", int(f.Encoding))
}

// Blocks returns the number of absmax blocks of a state of n elements:
// ceil(n/BlockSize) for 8-bit blockwise states (the last block may be
// shorter), 0 for the other formats.
func (f StateFormat) Blocks(n int64) int64 {
	if f.Encoding != EncodingBlockwise8 || n <= 0 {
		return 0
	}
	b := int64(f.blockSize())
	return (n + b - 1) / b
}

func (f StateFormat) blockSize() int {
	if f.BlockSize == 0 {
		return Blockwise8BlockSize
	}
	return f.BlockSize
}

// StateBytes returns the bytes one state of n elements takes in format f:
// 4n (fp32), 2n (bf16), or n codes plus 4 bytes of absmax per block
// (8-bit blockwise). n <= 0 takes none.
func (f StateFormat) StateBytes(n int64) int64 {
	if n <= 0 {
		return 0
	}
	switch f.Encoding {
	case EncodingBF16:
		return 2 * n
	case EncodingBlockwise8:
		return n + 4*f.Blocks(n)
	}
	return 4 * n
}

// RecordBytes returns the bytes of a record of n elements holding the
// fp32 master and the states of h's rule (h.StateCount of them) in format
// f, back to back (no stagger padding): 4n + StateCount*StateBytes(n).
func (f StateFormat) RecordBytes(h Hyper, n int64) int64 {
	if n <= 0 {
		return 0
	}
	return 4*n + int64(h.StateCount())*f.StateBytes(n)
}
