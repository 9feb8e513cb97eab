package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"github.com/nats-io/nats-server/v2/server"
)

// logFlags are --log-level and --log-format, which every role takes.
type logFlags struct {
	level, format string
	debug         bool // the older --debug: --log-level debug
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "", "log format: json or text (default: text on a terminal, json otherwise)")
	fs.BoolVar(&l.debug, "debug", false, "same as --log-level debug")
}

// logger is the role's logger on w, as the flags say.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	if l.debug {
		lvl = slog.LevelDebug
	}
	format := l.format
	if format == "" {
		format = "json"
		if isTerminal(w) {
			format = "text"
		}
	}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationsAsStrings})), nil
	case "text":
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: lvl, TimeFormat: time.TimeOnly, NoColor: !isTerminal(w)})), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", l.format)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// durationsAsStrings writes a duration as Go writes it ("30s", "1.5ms"),
// not as a count of nanoseconds.
func durationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// natsLog hands the embedded nats-server's own log to ours: its warnings
// and errors as they are, its notices at debug level (it says a lot as it
// starts), its debug and trace lines not at all (they are off).
type natsLog struct{ log *slog.Logger }

var _ server.Logger = natsLog{}

func (n natsLog) line(level slog.Level, format string, v []any) {
	n.log.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, v...)))
}

func (n natsLog) Noticef(format string, v ...any) { n.line(slog.LevelDebug, format, v) }
func (n natsLog) Warnf(format string, v ...any)   { n.line(slog.LevelWarn, format, v) }
func (n natsLog) Fatalf(format string, v ...any)  { n.line(slog.LevelError, format, v) }
func (n natsLog) Errorf(format string, v ...any)  { n.line(slog.LevelError, format, v) }
func (n natsLog) Debugf(format string, v ...any)  { n.line(slog.LevelDebug, format, v) }
func (n natsLog) Tracef(format string, v ...any)  { n.line(slog.LevelDebug-4, format, v) }

// newLogger is a logger at level in the default format for w.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	l, err := (&logFlags{level: level.String()}).logger(w)
	if err != nil {
		panic(err) // a slog.Level's own name always parses
	}
	return l
}

// roleFlags is the flag set of a process role (serve, setup, worker,
// health) with the flags they all take: how to reach NATS and how to log.
func roleFlags(name string, stderr io.Writer) (*flag.FlagSet, *natsFlags, *logFlags) {
	fs := newFlags(name, stderr)
	var (
		nf natsFlags
		lf logFlags
	)
	nf.register(fs)
	lf.register(fs)
	return fs, &nf, &lf
}
