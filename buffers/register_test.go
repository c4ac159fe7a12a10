package buffers_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/zinfio/zinf/buffers"
)

// fakeRegistrar records what a pool registers and unregisters, and reads
// the first byte of the memory when it is unregistered (which faults if the
// arena was unmapped first).
type fakeRegistrar struct {
	mu         sync.Mutex
	registered [][]byte
	calls      []string
	refuse     error
}

func (r *fakeRegistrar) RegisterMemory(mem []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "register")
	r.registered = append(r.registered, mem)
	return r.refuse
}

func (r *fakeRegistrar) UnregisterMemory(mem []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = mem[0] // still mapped
	for i, m := range r.registered {
		if unsafe.SliceData(m) == unsafe.SliceData(mem) && len(m) == len(mem) {
			r.registered = append(r.registered[:i], r.registered[i+1:]...)
			r.calls = append(r.calls, "unregister")
			return nil
		}
	}
	return errors.New("not registered")
}

func (r *fakeRegistrar) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.calls, ",")
}

// TestPoolRegister: the arena is registered whole with each registrar and
// unregistered before it is unmapped, also when Close had to wait for an
// outstanding buffer, and also when the registrar refused it (it may keep
// it in its set anyway). A registrar cannot be given the arena twice, and
// a closed pool registers nothing.
func TestPoolRegister(t *testing.T) {
	p, err := buffers.NewPool(buffers.Options{CapacityBytes: 256 << 10, Pin: buffers.PinOff})
	if err != nil {
		t.Fatal(err)
	}
	a, b := &fakeRegistrar{}, &fakeRegistrar{refuse: errors.New("no room")}
	if err := p.Register(a); err != nil {
		t.Fatal(err)
	}
	if err := p.Register(b); err == nil || err.Error() != "no room" {
		t.Fatalf("Register with a refusing registrar: %v, want its error", err)
	}
	if err := p.Register(a); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("Register twice with one registrar: %v", err)
	}
	arena := p.Regions()[0]
	if len(a.registered) != 1 || unsafe.SliceData(a.registered[0]) != unsafe.SliceData(arena) || len(a.registered[0]) != len(arena) {
		t.Fatalf("registered %d regions; want the whole arena once", len(a.registered))
	}
	buf, err := p.Acquire(context.Background(), 4096, buffers.PurposeOptimizer)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); !errors.Is(err, buffers.ErrOutstanding) {
		t.Fatalf("Close with a buffer out: %v", err)
	}
	if a.log() != "register" || b.log() != "register" {
		t.Fatalf("unregistered while a buffer was out: %q, %q", a.log(), b.log())
	}
	buf.Release() // the last one: unregister, then unmap
	if a.log() != "register,unregister" || b.log() != "register,unregister" {
		t.Fatalf("after the last release: %q, %q; want each registered once and unregistered once", a.log(), b.log())
	}
	if err := p.Register(&fakeRegistrar{}); !errors.Is(err, buffers.ErrClosed) {
		t.Fatalf("Register after Close: %v, want ErrClosed", err)
	}
}
