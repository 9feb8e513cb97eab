package main

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"errors"
	"testing"
)

func TestParseCloudConfig(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("zipped\n"))
	zw.Close()
	gzb64 := base64.StdEncoding.EncodeToString(gz.Bytes())
	b64 := base64.StdEncoding.EncodeToString([]byte("http_port 3129\n"))
	for _, tc := range []struct {
		name string
		ud   string
		want map[string]string // nil: want an error
		not  bool              // the error is errNotCloudConfig
	}{
		{"plain block", "#cloud-config\nwrite_files:\n- path: /a\n  content: |\n    line 1\n    line 2\n", map[string]string{"/a": "line 1\nline 2\n"}, false},
		{"b64", "#cloud-config\nwrite_files:\n  - path: /etc/squid/squid.conf\n    encoding: b64\n    content: " + b64 + "\n", map[string]string{"/etc/squid/squid.conf": "http_port 3129\n"}, false},
		{"base64 split over lines", "#cloud-config\nwrite_files:\n  - path: /b\n    encoding: base64\n    content: |\n      " + b64[:8] + "\n      " + b64[8:] + "\n", map[string]string{"/b": "http_port 3129\n"}, false},
		{"gzip+base64", "#cloud-config\nwrite_files:\n  - {path: /z, encoding: gz+b64, content: " + gzb64 + "}\n", map[string]string{"/z": "zipped\n"}, false},
		{"later replaces, append appends", "#cloud-config\nwrite_files:\n- {path: /a, content: one}\n- {path: /a, content: two}\n- {path: /a, content: '+', append: true}\n", map[string]string{"/a": "two+"}, false},
		{"other keys and quoted permissions", "#cloud-config\nhostname: \"p1\"\nwrite_files:\n- path: /p\n  owner: root:proxy\n  permissions: \"0640\"\n  content: |\n    fleet:$2a$10$x\nruncmd:\n- [sh, -c, 'echo hi']\n- [systemctl, restart, squid]\n", map[string]string{"/p": "fleet:$2a$10$x\n"}, false},
		{"no write_files", "#cloud-config\nhostname: p1\n", map[string]string{}, false},
		{"crlf first line", "#cloud-config\r\nwrite_files: []\r\n", map[string]string{}, false},
		{"script", "#!/bin/sh\necho hi\n", nil, true},
		{"empty", "", nil, true},
		{"cloud-config later", "\n#cloud-config\n", nil, true},
		{"bad yaml", "#cloud-config\nwrite_files: [\n", nil, false},
		{"bad base64", "#cloud-config\nwrite_files:\n- {path: /a, encoding: b64, content: '***'}\n", nil, false},
		{"unknown encoding", "#cloud-config\nwrite_files:\n- {path: /a, encoding: rot13, content: x}\n", nil, false},
		{"no path", "#cloud-config\nwrite_files:\n- {content: x}\n", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, err := ParseCloudConfig([]byte(tc.ud))
			if tc.want == nil {
				if err == nil {
					t.Fatalf("want an error, got %v", cc.Files)
				}
				if errors.Is(err, errNotCloudConfig) != tc.not {
					t.Fatalf("errNotCloudConfig=%t, want %t: %v", !tc.not, tc.not, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(cc.Files) != len(tc.want) {
				t.Fatalf("files %q, want %q", cc.Files, tc.want)
			}
			for p, w := range tc.want {
				if string(cc.Files[p]) != w {
					t.Fatalf("%s = %q, want %q", p, cc.Files[p], w)
				}
			}
		})
	}
}
