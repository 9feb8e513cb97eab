package fleet

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func TestClassOf(t *testing.T) {
	base := errors.New("boom")
	for _, tc := range []struct {
		name string
		err  error
		want Class
	}{
		{"nil", nil, ClassNone},
		{"unclassified is permanent", base, ClassPermanent},
		{"transient", Transient(base), ClassTransient},
		{"permanent", Permanent(base), ClassPermanent},
		{"not found", NotFound(base), ClassNotFound},
		{"wrapped transient", fmt.Errorf("define domain p1: %w", Transient(base)), ClassTransient},
		{"deadline", fmt.Errorf("call: %w", context.DeadlineExceeded), ClassTransient},
		{"canceled", context.Canceled, ClassTransient},
		{"outer transient wins over inner permanent", Transient(Permanent(base)), ClassTransient},
		{"outer permanent wins over inner transient", Permanent(fmt.Errorf("x: %w", Transient(base))), ClassPermanent},
		{"transient wrap around a join holding a permanent", Transient(errors.Join(Permanent(base), base)), ClassTransient},
		{"join: the shallower class wins", errors.Join(base, fmt.Errorf("a: %w", Transient(base))), ClassTransient},
		{"explicit permanent beats a deadline inside", Permanent(context.DeadlineExceeded), ClassPermanent},
	} {
		if got := ClassOf(tc.err); got != tc.want {
			t.Errorf("%s: ClassOf = %q, want %q", tc.name, got, tc.want)
		}
	}
	if Transient(nil) != nil {
		t.Error("Transient(nil) != nil")
	}
	err := Transient(base)
	if err.Error() != "boom" || !errors.Is(err, base) || !errors.Is(err, ErrTransient) {
		t.Errorf("wrap changed the error: %v", err)
	}
}
