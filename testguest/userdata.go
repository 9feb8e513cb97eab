package main

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// errNotCloudConfig is returned for user-data that cloud-init would not read
// as a cloud-config (a script, #include, MIME multipart, empty).
var errNotCloudConfig = errors.New("user-data is not a #cloud-config")

// CloudConfig is the part of a cloud-config the test guest acts on.
type CloudConfig struct {
	// Files maps each write_files path to the content cloud-init would leave
	// there (later entries replace earlier ones unless they append).
	Files map[string][]byte
}

type writeFile struct {
	Path     string `yaml:"path"`
	Content  string `yaml:"content"`
	Encoding string `yaml:"encoding"`
	Append   bool   `yaml:"append"`
}

// ParseCloudConfig reads user-data as cloud-init's cloud-config: the first
// line must start with "#cloud-config" (errNotCloudConfig otherwise).
func ParseCloudConfig(b []byte) (*CloudConfig, error) {
	b = bytes.TrimPrefix(b, []byte("\ufeff"))
	first, _, _ := bytes.Cut(b, []byte("\n"))
	if !bytes.HasPrefix(bytes.TrimRight(first, "\r"), []byte("#cloud-config")) {
		return nil, errNotCloudConfig
	}
	var doc struct {
		WriteFiles []writeFile `yaml:"write_files"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("cloud-config: %w", err)
	}
	cc := &CloudConfig{Files: map[string][]byte{}}
	for i, f := range doc.WriteFiles {
		if f.Path == "" {
			return nil, fmt.Errorf("cloud-config: write_files[%d] has no path", i)
		}
		content, err := decodeContent(f.Content, f.Encoding)
		if err != nil {
			return nil, fmt.Errorf("cloud-config: write_files[%d] %s: %w", i, f.Path, err)
		}
		if f.Append {
			content = append(cc.Files[f.Path], content...)
		}
		cc.Files[f.Path] = content
	}
	return cc, nil
}

// decodeContent undoes write_files' encoding (cloud-init's names for it).
func decodeContent(s, encoding string) ([]byte, error) {
	b64 := func(s string) ([]byte, error) {
		// cloud-init tolerates line breaks inside base64 content.
		b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(s), ""))
		if err != nil {
			return nil, fmt.Errorf("base64: %w", err)
		}
		return b, nil
	}
	gunzip := func(b []byte) ([]byte, error) {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		out, err := io.ReadAll(zr)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return out, nil
	}
	switch strings.ToLower(strings.TrimSpace(encoding)) {
	case "", "text/plain":
		return []byte(s), nil
	case "b64", "base64":
		return b64(s)
	case "gz", "gzip":
		return gunzip([]byte(s))
	case "gz+base64", "gzip+base64", "gz+b64", "gzip+b64":
		b, err := b64(s)
		if err != nil {
			return nil, err
		}
		return gunzip(b)
	default:
		return nil, fmt.Errorf("unknown encoding %q", encoding)
	}
}
