//go:build !linux

package gds

import (
	"errors"
	"os"
)

var errNotLinux = errors.New("GPUDirect Storage runs on Linux only")

func filesystemName(string) (string, error) { return "", errNotLinux }

func filesystemSupported(path string) error { return errNotLinux }

func registrationFd(fd int) (int, *os.File, error) { return fd, nil, nil }
