package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"proxyfleet/fleet"
)

// Fault is an injected failure: the next Count calls of Op (create, get,
// delete, list or sweep; or delete-volumes, a delete failing after its
// domain is gone and before its volume is), for proxy ID or any proxy if ID
// is empty,
// fail with an error of Class. A negative Count never runs out.
type Fault struct {
	Op    string      `json:"op"`
	ID    string      `json:"id,omitempty"`
	Class fleet.Class `json:"class"`
	Count int         `json:"count"`
}

const faultFile = "faults.json"

// InjectFault adds f to the host directory dir. It works across processes:
// every call of every driver on dir reads the file.
func InjectFault(dir string, f Fault) error {
	return withFaults(dir, func(fs []Fault) []Fault { return append(fs, f) })
}

// ClearFaults removes every injected fault.
func ClearFaults(dir string) error {
	return withFaults(dir, func([]Fault) []Fault { return nil })
}

// withFaults edits the fault file under an exclusive flock.
func withFaults(dir string, edit func([]Fault) []Fault) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(filepath.Join(dir, faultFile+".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	var fs []Fault
	path := filepath.Join(dir, faultFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &fs); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	fs = edit(fs)
	if len(fs) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	b, _ = json.Marshal(fs)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// ErrInjected is inside every injected fault.
var ErrInjected = errors.New("injected fault")

// takeFault consumes one matching fault, if any, and returns its error.
func takeFault(dir, op, id string) error {
	if err := unix.Access(filepath.Join(dir, faultFile), unix.F_OK); err == unix.ENOENT {
		return nil // the common case costs one access(2), which makes no FileInfo
	}
	var hit *Fault
	err := withFaults(dir, func(fs []Fault) []Fault {
		out := fs[:0]
		for _, f := range fs {
			if hit == nil && f.Op == op && (f.ID == "" || f.ID == id) && f.Count != 0 {
				h := f
				hit = &h
				if f.Count > 0 {
					f.Count--
				}
			}
			if f.Count != 0 {
				out = append(out, f)
			}
		}
		return out
	})
	if err != nil {
		return fleet.Transient(fmt.Errorf("read faults: %w", err))
	}
	if hit == nil {
		return nil
	}
	e := fmt.Errorf("%w (%s)", ErrInjected, hit.Class)
	switch hit.Class {
	case fleet.ClassTransient:
		return fleet.Transient(e)
	case fleet.ClassNotFound:
		return fleet.NotFound(e)
	default:
		return fleet.Permanent(e)
	}
}
