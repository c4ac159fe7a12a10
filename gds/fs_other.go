//go:build !linux

package gds

import "errors"

var errNotLinux = errors.New("GPUDirect Storage runs on Linux only")

func filesystemName(string) (string, error) { return "", errNotLinux }

func filesystemSupported(path string) error { return errNotLinux }
