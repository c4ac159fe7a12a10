//go:build !cgo

package dl

import "unsafe"

// Library is a loaded library; without cgo there never is one.
type Library struct{}

// Path returns "".
func (l *Library) Path() string { return "" }

// Table returns nil.
func (l *Library) Table() unsafe.Pointer { return nil }

// Has reports false.
func (l *Library) Has(int) bool { return false }

// Cache would load libraries; without cgo, Load always fails.
type Cache[T any] struct{}

// NewCache returns a cache whose Load fails with ErrNoCgo.
func NewCache[T any]([]Symbol, func(*Library) T) *Cache[T] { return &Cache[T]{} }

// Load fails with ErrNoCgo.
func (c *Cache[T]) Load(string) (T, error) {
	var zero T
	return zero, ErrNoCgo
}
