// Package fleet is the vocabulary the worker and the providers share: the
// Spec of a proxy, the Instance observed on a host, and the error classes
// every layer agrees on:
// transient (retry with backoff), permanent (fail now) and not-found.
//
// Providers classify their own failures once, at their boundary, by wrapping
// with Transient, Permanent or NotFound; everything above matches with
// errors.Is and ClassOf, never on error strings.
package fleet
