package main

import (
	"cmp"
	"io"
	"runtime"
	"runtime/debug"

	"proxyfleet/client"
)

// buildVersion and buildCommit are set by the linker (make build:
// -X main.buildVersion=... -X main.buildCommit=...); otherwise they come
// from the build info Go stamps into the binary, where it has them.
var buildVersion, buildCommit string

// versionInfo is what `proxyfleet version` prints.
type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"`
	BuildTime string `json:"build_time,omitempty"`
	Go        string `json:"go"`
}

// readVersion reads the version from the build info Go stamps into every
// binary (module version, VCS revision and time).
func readVersion() versionInfo {
	v := versionInfo{Version: buildVersion, Commit: buildCommit, Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		v.Version = cmp.Or(v.Version, "(devel)")
		v.Commit = cmp.Or(v.Commit, "unknown")
		return v
	}
	if v.Version == "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = cmp.Or(v.Commit, s.Value)
		case "vcs.time":
			v.BuildTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	v.Version = cmp.Or(v.Version, "(devel)")
	v.Commit = cmp.Or(v.Commit, "unknown")
	return v
}

// version is `proxyfleet version`.
func version(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError(fs)
	}
	v := readVersion()
	if *asJSON {
		return client.WriteJSON(stdout, v)
	}
	mod := ""
	if v.Modified {
		mod = " (modified)"
	}
	_, err := io.WriteString(stdout, "proxyfleet "+v.Version+"\ncommit "+v.Commit+mod+"\n"+v.Go+"\n")
	return err
}
