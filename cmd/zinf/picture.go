package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/zinfio/zinf/cmd/zinf/internal/plots"
)

// checkNewPicture checks a picture flag before work is done: a known
// format by extension, and no file there (zinf writes only files it
// creates). An empty path is no picture.
func checkNewPicture(flagName, path string) error {
	if path == "" {
		return nil
	}
	var errs []error
	if _, err := plots.FormatOf(path); err != nil {
		errs = append(errs, fmt.Errorf("%s %w", flagName, err))
	}
	if _, err := os.Lstat(path); err == nil {
		errs = append(errs, fmt.Errorf("%s %s already exists: zinf writes only files it creates; choose another name or remove it", flagName, path))
	}
	return errors.Join(errs...)
}

// writePicture creates path (it must not exist) and draws into it; a
// failed drawing removes the file it created.
func writePicture(flagName, path string, draw func(w io.Writer, format string) error) error {
	format, err := plots.FormatOf(path)
	if err != nil {
		return fmt.Errorf("%s %w", flagName, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", flagName, err)
	}
	err = draw(f, format)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("%s %s: %w", flagName, path, err)
	}
	return nil
}
