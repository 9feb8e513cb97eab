package fleet

import "context"

type progressKey struct{}

// WithProgress returns a context whose long operations (a base image
// transfer, say) report what they are doing to f. f must not block: it is
// called from the operation's own goroutines.
func WithProgress(ctx context.Context, f func(msg string)) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

// ReportProgress tells ctx's progress listener, if any, what is happening.
func ReportProgress(ctx context.Context, msg string) {
	if f, ok := ctx.Value(progressKey{}).(func(string)); ok && f != nil {
		f(msg)
	}
}
