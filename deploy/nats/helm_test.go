package nats_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"
)

// helmValues is the part of the NATS chart's values (nats-io/k8s,
// helm/charts/nats/values.yaml, 2.14) that helm-values.yaml sets, named as
// the chart names it. It is decoded strictly: a key the chart does not
// have (a typo, a 0.x name) fails the test instead of being ignored by
// helm.
type helmValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool `yaml:"enabled"`
			Replicas int  `yaml:"replicas"`
		} `yaml:"cluster"`
		JetStream struct {
			Enabled   bool `yaml:"enabled"`
			FileStore struct {
				PVC struct {
					Size string `yaml:"size"`
				} `yaml:"pvc"`
			} `yaml:"fileStore"`
		} `yaml:"jetstream"`
		Merge map[string]any `yaml:"merge"`
	} `yaml:"config"`
	Container struct {
		Env   map[string]envValue `yaml:"env"`
		Patch []jsonPatch         `yaml:"patch"`
	} `yaml:"container"`
	PodTemplate struct {
		Patch                     []jsonPatch               `yaml:"patch"`
		TopologySpreadConstraints map[string]map[string]any `yaml:"topologySpreadConstraints"`
	} `yaml:"podTemplate"`
	PromExporter struct {
		Enabled    bool `yaml:"enabled"`
		PodMonitor struct {
			Enabled bool `yaml:"enabled"`
		} `yaml:"podMonitor"`
	} `yaml:"promExporter"`
	NatsBox struct {
		Enabled bool `yaml:"enabled"`
	} `yaml:"natsBox"`
}

type envValue struct {
	ValueFrom struct {
		SecretKeyRef struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type jsonPatch struct {
	Op    string         `yaml:"op"`
	Path  string         `yaml:"path"`
	Value map[string]any `yaml:"value"`
}

func readHelmValues(t *testing.T) helmValues {
	t.Helper()
	b, err := os.ReadFile("helm-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v helmValues
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("helm-values.yaml: %v", err)
	}
	return v
}

// renderChartConfig makes the nats.conf the chart makes from v for pod
// nats-0 of release "nats": its base (files/config/config.yaml, cluster.yaml,
// jetstream.yaml) with config.merge merged over it, written as the chart
// writes it: JSON, then "<< X >>" unquoted and "$include" keys turned into
// include directives.
func renderChartConfig(t *testing.T, v helmValues) string {
	t.Helper()
	c := v.Config
	conf := map[string]any{
		"server_name":            "<< $SERVER_NAME >>",
		"lame_duck_grace_period": "10s",
		"lame_duck_duration":     "30s",
		"pid_file":               "/var/run/nats/nats.pid",
		"port":                   4222,
		"http_port":              8222,
	}
	if c.Cluster.Enabled {
		var routes []string
		for i := range c.Cluster.Replicas {
			routes = append(routes, fmt.Sprintf("nats://nats-%d.nats-headless:6222", i))
		}
		conf["cluster"] = map[string]any{"name": "nats", "port": 6222, "no_advertise": true, "routes": routes}
	}
	if c.JetStream.Enabled {
		conf["jetstream"] = map[string]any{
			"max_memory_store": 0, "store_dir": "/data",
			"max_file_store": "<< " + c.JetStream.FileStore.PVC.Size + " >>",
		}
	}
	for k, val := range c.Merge {
		conf[k] = val
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(conf); err != nil {
		t.Fatal(err)
	}
	out := regexp.MustCompile(`".*\$include": "(.*)",?`).ReplaceAllString(buf.String(), "include ${1};")
	return regexp.MustCompile(`"<<\s+(.*?)\s+>>"`).ReplaceAllString(out, "${1}")
}

// TestHelmValues renders the NATS config the chart makes from
// helm-values.yaml and loads it with the server's loader, in a file tree
// laid out as the pod's (the chart's config at /etc/nats-config, the
// accounts ConfigMap where the values mount it) and with only the
// environment the values give the container: every password accounts.conf
// reads must come from there.
func TestHelmValues(t *testing.T) {
	v := readHelmValues(t)
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 || !v.Config.JetStream.Enabled {
		t.Errorf("cluster %v of %d, jetstream %v: want JetStream on 3 servers (R3)", v.Config.Cluster.Enabled, v.Config.Cluster.Replicas, v.Config.JetStream.Enabled)
	}
	if len(v.PodTemplate.TopologySpreadConstraints) == 0 {
		t.Error("no topology spread: the three servers may share a node")
	}

	// The accounts ConfigMap: a volume of the pod, mounted in the nats
	// container.
	var cmName, mountPath string
	for _, p := range v.PodTemplate.Patch {
		if p.Op == "add" && p.Path == "/spec/volumes/-" && p.Value["name"] == "proxyfleet-accounts" {
			cm, _ := p.Value["configMap"].(map[string]any)
			cmName, _ = cm["name"].(string)
		}
	}
	for _, p := range v.Container.Patch {
		if p.Op == "add" && p.Path == "/volumeMounts/-" && p.Value["name"] == "proxyfleet-accounts" {
			mountPath, _ = p.Value["mountPath"].(string)
		}
	}
	if cmName == "" || mountPath == "" {
		t.Fatalf("the proxyfleet-accounts volume is not both added to the pod (configMap %q) and mounted in the container (%q)", cmName, mountPath)
	}

	root := t.TempDir()
	// The ConfigMap made with --from-file=deploy/nats/accounts.conf has
	// the key accounts.conf.
	copyFile(t, "accounts.conf", filepath.Join(root, mountPath, "accounts.conf"))
	conf := renderChartConfig(t, v)
	if !strings.Contains(conf, "include ") {
		t.Fatalf("the rendered config includes nothing:\n%s", conf)
	}
	confPath := filepath.Join(root, "etc/nats-config/nats.conf")
	mustWrite(t, confPath, conf)

	// Only the container's environment (and the chart's SERVER_NAME).
	for _, k := range append(slices.Clone(passwords), "SERVER_NAME") {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	t.Setenv("SERVER_NAME", "nats-0")
	for k, e := range v.Container.Env {
		ref := e.ValueFrom.SecretKeyRef
		if ref.Name != "proxyfleet-nats-users" || ref.Key == "" {
			t.Errorf("env %s from secret %q key %q: want a key of proxyfleet-nats-users", k, ref.Name, ref.Key)
		}
		t.Setenv(k, "secret-"+ref.Key)
	}
	opts, err := server.ProcessConfigFile(confPath)
	if err != nil {
		t.Fatalf("the chart's config from helm-values.yaml: %v\n%s", err, conf)
	}
	checkAccounts(t, opts)
	if !opts.JetStream || len(opts.Routes) != 3 || opts.ServerName != "nats-0" {
		t.Errorf("jetstream %v, %d routes, server name %q", opts.JetStream, len(opts.Routes), opts.ServerName)
	}
	// The include resolves under the mount, relative to the chart's file.
	inc, _ := v.Config.Merge["$include"].(string)
	if got := path.Clean(path.Join("/etc/nats-config", inc)); got != path.Join(mountPath, "accounts.conf") {
		t.Errorf("$include %s resolves to %s, the ConfigMap is at %s", inc, got, mountPath)
	}
	for _, u := range opts.Users {
		if u.Account != nil && u.Account.Name == "PROXYFLEET" && !strings.HasPrefix(u.Password, "secret-") {
			t.Errorf("user %s's password %q does not come from the secret", u.Username, u.Password)
		}
	}
}
