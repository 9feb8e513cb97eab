package fleet

import (
	"context"
	"errors"
)

// Class is the retry class of an error, as carried in the wire field "class".
type Class string

// The classes. ClassNone is the class of a nil error.
const (
	ClassNone      Class = ""
	ClassTransient Class = "transient"
	ClassPermanent Class = "permanent"
	ClassNotFound  Class = "not_found"
)

// Sentinels matched with errors.Is.
var (
	ErrTransient = errors.New("transient")
	ErrPermanent = errors.New("permanent")
	ErrNotFound  = errors.New("not found")
)

// classed wraps an error with a class sentinel without changing its message.
type classed struct {
	err   error
	class error
}

func (c *classed) Error() string   { return c.err.Error() }
func (c *classed) Unwrap() []error { return []error{c.class, c.err} }

func wrap(class, err error) error {
	if err == nil {
		return nil
	}
	return &classed{err: err, class: class}
}

// Transient marks err as worth retrying. A Transient wrap wins over any class
// found deeper inside err (see ClassOf).
func Transient(err error) error { return wrap(ErrTransient, err) }

// Permanent marks err as not worth retrying.
func Permanent(err error) error { return wrap(ErrPermanent, err) }

// NotFound marks err as "the thing is not there".
func NotFound(err error) error { return wrap(ErrNotFound, err) }

// ClassOf returns the class of err. The outermost explicit class wins, so a
// Transient wrap around an error that contains a permanent code stays
// transient. Context cancellation and deadlines are transient: the work was
// interrupted, not refused. An unclassified error is permanent: only errors
// known to be transient are retried.
func ClassOf(err error) Class {
	if err == nil {
		return ClassNone
	}
	if c := outermost(err); c != ClassNone {
		return c
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return ClassTransient
	}
	return ClassPermanent
}

// outermost returns the first class sentinel met walking err's tree
// breadth first, so the wrap closest to the caller decides.
func outermost(err error) Class {
	c := ClassNone
	Walk(err, func(e error) bool {
		switch e {
		case ErrTransient:
			c = ClassTransient
		case ErrPermanent:
			c = ClassPermanent
		case ErrNotFound:
			c = ClassNotFound
		}
		return c != ClassNone
	})
	return c
}

// Walk visits err and everything it wraps (Unwrap() error and
// Unwrap() []error alike) breadth first, closest to the caller first,
// until visit returns true. It reports whether visit did. Classifiers use
// it so that the error nearest the caller decides.
func Walk(err error, visit func(error) bool) bool {
	queue := []error{err}
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		if e == nil {
			continue
		}
		if visit(e) {
			return true
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			queue = append(queue, u.Unwrap())
		case interface{ Unwrap() []error }:
			queue = append(queue, u.Unwrap()...)
		}
	}
	return false
}

// IsTransient reports whether err should be retried.
func IsTransient(err error) bool { return ClassOf(err) == ClassTransient }
