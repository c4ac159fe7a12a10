package aio

// Op is the direction of a request.
type Op uint8

const (
	// OpRead reads from the file into the buffer.
	OpRead Op = iota
	// OpWrite writes the buffer to the file.
	OpWrite
)

// String returns "read" or "write".
func (o Op) String() string {
	if o == OpWrite {
		return "write"
	}
	return "read"
}
