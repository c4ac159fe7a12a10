package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry holding c and the Go runtime's and the
// process's collectors (memory, GC, CPU, open files): what a scrape of a
// training process should show beside zinf's own metrics.
func NewRegistry(c *Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Server serves a registry's metrics over HTTP at /metrics.
type Server struct {
	srv  *http.Server
	addr string
	done chan error
}

// Serve listens on addr ("host:port"; port 0 picks a free one, see Addr)
// and serves g's metrics at /metrics in the background. It returns once
// the socket listens, or the error that kept it from listening.
func Serve(addr string, g prometheus.Gatherer) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listening on %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, addr: ln.Addr().String(), done: make(chan error, 1)}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on (with the port chosen when
// the one asked for was 0).
func (s *Server) Addr() string { return s.addr }

// Close stops the server: it stops listening and waits, until ctx is done,
// for scrapes in progress to finish. It returns the error that ended the
// server, if any other than its closing.
func (s *Server) Close(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	if err != nil {
		s.srv.Close()
	}
	if serr := <-s.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
