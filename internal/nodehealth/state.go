package nodehealth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxStateFile bounds what LoadState reads: the file is a few dozen bytes.
const maxStateFile = 4096

// LoadState reads a state saved by FileSaver; ok is false when there is
// none. A damaged file is an error, which the caller reports and ignores.
func LoadState(path string) (st State, ok bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, false, nil
	}
	if err != nil {
		return State{}, false, fmt.Errorf("reading the saved node state: %w", err)
	}
	defer func() { _ = f.Close() }()
	buf, err := io.ReadAll(io.LimitReader(f, maxStateFile+1))
	if err != nil {
		return State{}, false, fmt.Errorf("reading the saved node state: %w", err)
	}
	if len(buf) > maxStateFile {
		return State{}, false, fmt.Errorf("the saved node state %s is larger than %d bytes", path, maxStateFile)
	}
	if err := json.Unmarshal(buf, &st); err != nil {
		return State{}, false, fmt.Errorf("decoding the saved node state %s: %w", path, err)
	}
	return st, true, nil
}

// FileSaver saves a state to path, replacing it whole (a temporary file
// renamed over it), so that a crash never leaves half a file.
func FileSaver(path string) func(State) error {
	return func(st State) error {
		data, err := json.Marshal(st)
		if err != nil {
			return err
		}
		tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
		if err != nil {
			return fmt.Errorf("saving the node state: %w", err)
		}
		defer func() { _ = os.Remove(tmp.Name()) }()
		if _, err := tmp.Write(data); err != nil {
			_ = tmp.Close()
			return fmt.Errorf("saving the node state: %w", err)
		}
		if err := tmp.Sync(); err != nil {
			_ = tmp.Close()
			return fmt.Errorf("saving the node state: %w", err)
		}
		if err := tmp.Close(); err != nil {
			return fmt.Errorf("saving the node state: %w", err)
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			return fmt.Errorf("saving the node state: %w", err)
		}
		return nil
	}
}
