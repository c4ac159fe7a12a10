package crc32c

// SetFold lets Update use the folding kernel (where canFold) or not, and
// returns the previous setting, for the tests of both paths.
func SetFold(on bool) (was bool) {
	was = haveFold
	haveFold = on && canFold
	return was
}

// FoldMin and FoldBlock are Update's thresholds for the kernel.
const FoldMin, FoldBlock = foldMin, foldBlock

// CanFold reports whether this CPU runs the folding kernel.
func CanFold() bool { return canFold }
