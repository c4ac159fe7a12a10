// Package trace is zinf's timeline seam. A Runtime given a Sink in
// zinf.Options.Trace reports what it does as Events: each layer's compute
// (from BeginLayer's return to EndLayer) and the loop's waits, every swap
// store read and write (a swap-in, a swap-out, with its bytes), the stages
// of each optimizer sub-group (read, update, write), each optimizer step
// and each speculative step rolled back. With no Sink (the default) the
// code that would report them costs one nil check: no allocation, no
// clock read beyond what the runtime does anyway.
//
// ChromeWriter is a Sink that writes the Chrome trace-event format, which
// Perfetto (ui.perfetto.dev) and chrome://tracing open: one process per
// rank, one thread per track, spans that overlap spread over lanes. It
// streams: a trace of a long run costs disk, not memory (ChromeOptions.Steps
// keeps the first steps only). ReadChrome reads such a file back, for
// tools that draw it (zinf timeline).
//
// Basic use:
//
//	f, _ := os.Create("run.trace.json")
//	tw := trace.NewChromeWriter(f, trace.ChromeOptions{})
//	rt, err := zinf.Open(cfg, model, zinf.Options{Trace: tw})
//	// ... train ...
//	rt.Close()
//	tw.Close() // writes the end of the file
//	f.Close()
//
// A Sink of your own receives Events by value, concurrently, from the
// loop's goroutine and from I/O completions: buffer them and return.
package trace
