package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"proxyfleet/config"
)

// serviceMonitor is the Prometheus operator's ServiceMonitor
// (monitoring.coreos.com/v1), the fields this repository uses.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// manifests are the objects of deploy/k8s/proxyfleet.yaml, each decoded
// into its Kubernetes API type.
type manifests struct {
	namespaces  []corev1.Namespace
	configMaps  []corev1.ConfigMap
	deployments map[string]appsv1.Deployment // by role: proxyfleet-<role>
	services    []corev1.Service
	pdbs        []policyv1.PodDisruptionBudget
	monitors    []serviceMonitor
}

// strictJSON decodes v (a YAML document, as JSON) into out, refusing any
// field the type does not have: a misspelt or misplaced field fails here
// instead of being dropped by the API server.
func strictJSON(v any, out any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}

func readManifests(t *testing.T) manifests {
	t.Helper()
	f, err := os.Open("k8s/proxyfleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := manifests{deployments: map[string]appsv1.Deployment{}}
	dec := yaml.NewDecoder(f)
	for i := 0; ; i++ {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		kind := fmt.Sprint(doc["apiVersion"], " ", doc["kind"])
		var obj any
		switch kind {
		case "v1 Namespace":
			obj = &corev1.Namespace{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "apps/v1 Deployment":
			obj = &appsv1.Deployment{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "policy/v1 PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "monitoring.coreos.com/v1 ServiceMonitor":
			obj = &serviceMonitor{}
		default:
			t.Fatalf("document %d: unexpected kind %s", i, kind)
		}
		if err := strictJSON(doc, obj); err != nil {
			t.Fatalf("document %d (%s): %v", i, kind, err)
		}
		switch o := obj.(type) {
		case *corev1.Namespace:
			m.namespaces = append(m.namespaces, *o)
		case *corev1.ConfigMap:
			m.configMaps = append(m.configMaps, *o)
		case *appsv1.Deployment:
			m.deployments[strings.TrimPrefix(o.Name, "proxyfleet-")] = *o
		case *corev1.Service:
			m.services = append(m.services, *o)
		case *policyv1.PodDisruptionBudget:
			m.pdbs = append(m.pdbs, *o)
		case *serviceMonitor:
			m.monitors = append(m.monitors, *o)
		}
	}
	return m
}

// k8sRoles: each Deployment's role (its name proxyfleet-<role>, its first
// argument) and the accounts.conf user it connects as.
var k8sRoles = []struct{ role, natsUser string }{{"setup", "admin"}, {"worker", "worker"}, {"health", "health"}, {"pools", "pools"}}

// dockerUser is the final stage's USER of the Dockerfile, uid and gid.
func dockerUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	_, stages := parseDockerfile(t, "../Dockerfile")
	u, g, _ := strings.Cut(stages[len(stages)-1].last(t, "USER").args, ":")
	uid, err1 := strconv.ParseInt(u, 10, 64)
	gid, err2 := strconv.ParseInt(g, 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("Dockerfile USER %s:%s: not numeric", u, g)
	}
	return uid, gid
}

func selects(t *testing.T, sel *metav1.LabelSelector, set map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(labels.Set(set))
}

func argValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

// TestK8sManifests decodes every object of deploy/k8s/proxyfleet.yaml
// into its API type (strictly) and checks that the objects fit each other
// and the rest of the repository: the pods' user is the image's and can
// read its secrets, each role has its own NATS user of accounts.conf and
// its own secret, probes hit the endpoints of the --http listener, the
// budgets, services and the ServiceMonitor select the pods, and the config
// parses and probes.
func TestK8sManifests(t *testing.T) {
	m := readManifests(t)
	users := accountsUsers(t)
	uid, gid := dockerUser(t)
	if len(m.namespaces) != 1 || m.namespaces[0].Name != "proxyfleet" {
		t.Fatalf("namespaces %v, want proxyfleet", m.namespaces)
	}
	ns := m.namespaces[0].Name
	if len(m.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps, want 1", len(m.configMaps))
	}
	cfgMap := m.configMaps[0]
	cfg, err := config.Parse([]byte(cfgMap.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("ConfigMap %s config.yaml: %v", cfgMap.Name, err)
	}

	secretUsers := map[string][]string{} // secret -> roles using it
	for _, r := range k8sRoles {
		d, ok := m.deployments[r.role]
		if !ok {
			t.Errorf("no Deployment for %s", r.role)
			continue
		}
		t.Run(r.role, func(t *testing.T) {
			if d.Namespace != ns {
				t.Errorf("namespace %q", d.Namespace)
			}
			pod := d.Spec.Template.Spec
			if !selects(t, d.Spec.Selector, d.Spec.Template.Labels) {
				t.Errorf("selector %v does not match the pod labels %v", d.Spec.Selector, d.Spec.Template.Labels)
			}
			sc := pod.SecurityContext
			if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != uid ||
				sc.RunAsGroup == nil || *sc.RunAsGroup != gid {
				t.Fatalf("pod securityContext %+v: want runAsNonRoot, runAsUser %d, runAsGroup %d (the image's USER)", sc, uid, gid)
			}
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(pod.Containers))
			}
			c := pod.Containers[0]
			if len(c.Args) == 0 || c.Args[0] != r.role {
				t.Errorf("args %v: want %s first", c.Args, r.role)
			}
			if v, ok := argValue(c.Args, "config"); !ok || !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
				return vm.MountPath == v && vm.SubPath == "config.yaml"
			}) {
				t.Errorf("--config %q is not the mounted config.yaml", v)
			}
			csc := c.SecurityContext
			if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
				csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem ||
				csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") {
				t.Errorf("container securityContext %+v: want no privilege escalation, a read-only root, all capabilities dropped", csc)
			}

			// NATS: its own user, password from its own secret.
			env := map[string]corev1.EnvVar{}
			for _, e := range c.Env {
				env[e.Name] = e
			}
			if u := env["NATS_USER"].Value; u != r.natsUser || !users[u] {
				t.Errorf("NATS_USER %q, want %s (a user of accounts.conf: %v)", u, r.natsUser, users)
			}
			pw := env["NATS_PASSWORD"].ValueFrom
			if pw == nil || pw.SecretKeyRef == nil || pw.SecretKeyRef.Name != "proxyfleet-nats-"+r.natsUser {
				t.Errorf("NATS_PASSWORD %+v: want from secret proxyfleet-nats-%s", pw, r.natsUser)
			} else {
				secretUsers[pw.SecretKeyRef.Name] = append(secretUsers[pw.SecretKeyRef.Name], r.role)
			}

			// Secret volumes: readable by the pod's user through fsGroup
			// (group read), by no one else.
			for _, v := range pod.Volumes {
				if v.Secret == nil {
					continue
				}
				secretUsers[v.Secret.SecretName] = append(secretUsers[v.Secret.SecretName], r.role)
				mode := int32(0o644)
				if v.Secret.DefaultMode != nil {
					mode = *v.Secret.DefaultMode
				}
				if sc.FSGroup == nil || mode&0o040 == 0 || mode&0o007 != 0 {
					fsg := "unset"
					if sc.FSGroup != nil {
						fsg = strconv.FormatInt(*sc.FSGroup, 10)
					}
					t.Errorf("secret volume %s: mode %#o with fsGroup %s: uid %d cannot read it (files are root-owned: want fsGroup and group read) or others can",
						v.Name, mode, fsg, uid)
				}
			}

			// The --http listener, its port, the probes on it.
			httpAddr, hasHTTP := argValue(c.Args, "http")
			if r.role == "setup" {
				return
			}
			_, port, err := net.SplitHostPort(httpAddr)
			if !hasHTTP || err != nil {
				t.Fatalf("args %v: want --http=:PORT", c.Args)
			}
			var httpPort int32
			for _, p := range c.Ports {
				if p.Name == "http" {
					httpPort = p.ContainerPort
				}
			}
			if strconv.Itoa(int(httpPort)) != port {
				t.Errorf("container port http %d, --http %s", httpPort, httpAddr)
			}
			for _, pr := range []struct {
				name string
				p    *corev1.Probe
				path string
			}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
				if pr.p == nil || pr.p.HTTPGet == nil || pr.p.HTTPGet.Path != pr.path || pr.p.HTTPGet.Port.String() != "http" {
					t.Errorf("%s probe %+v: want GET %s on port http", pr.name, pr.p, pr.path)
				}
			}
			if r.role == "worker" && pod.TerminationGracePeriodSeconds == nil {
				t.Error("no terminationGracePeriodSeconds for the worker's drain")
			}
		})
	}
	for s, roles := range secretUsers {
		if len(roles) != 1 {
			t.Errorf("secret %s is mounted or read by %v: want one role per secret", s, roles)
		}
	}
	if secretUsers["proxyfleet-ssh"] == nil || secretUsers["proxyfleet-ssh"][0] != "worker" {
		t.Errorf("the SSH secret reaches %v, want the worker alone", secretUsers["proxyfleet-ssh"])
	}

	checkK8sConfig(t, m, cfg)
	checkK8sSelectors(t, m)
}

// checkK8sConfig checks the config against the pods and the NATS cluster:
// replicas as the chart's servers, health probing on the health pod's
// probe port, the SSH files where the worker mounts its secret.
func checkK8sConfig(t *testing.T, m manifests, cfg *config.Config) {
	t.Helper()
	b, err := os.ReadFile("nats/helm-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var hv struct {
		Config struct {
			Cluster struct {
				Replicas int `yaml:"replicas"`
			} `yaml:"cluster"`
		} `yaml:"config"`
	}
	if err := yaml.Unmarshal(b, &hv); err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.Replicas != hv.Config.Cluster.Replicas {
		t.Errorf("nats.replicas %d, the NATS chart runs %d servers", cfg.NATS.Replicas, hv.Config.Cluster.Replicas)
	}
	if cfg.Health.Target == "" || cfg.Health.ProbeListen == "" {
		t.Errorf("health.target %q, health.probe_listen %q: want both (the probe target is the health pods' listener, reached through a Service)", cfg.Health.Target, cfg.Health.ProbeListen)
	}
	_, probePort, _ := net.SplitHostPort(cfg.Health.ProbeListen)
	hc := m.deployments["health"].Spec.Template.Spec.Containers
	if len(hc) == 0 || !slices.ContainsFunc(hc[0].Ports, func(p corev1.ContainerPort) bool {
		return p.Name == "probe" && strconv.Itoa(int(p.ContainerPort)) == probePort
	}) {
		t.Errorf("health.probe_listen %s is not the health container's port probe", cfg.Health.ProbeListen)
	}
	w := m.deployments["worker"].Spec.Template.Spec
	if len(w.Containers) == 0 {
		t.Fatal("no worker container")
	}
	sshMount := ""
	for _, vm := range w.Containers[0].VolumeMounts {
		for _, v := range w.Volumes {
			if v.Name == vm.Name && v.Secret != nil && v.Secret.SecretName == "proxyfleet-ssh" {
				sshMount = vm.MountPath
			}
		}
	}
	// The files are the secret's keys, as docs/OPERATIONS.md makes it.
	sshKeys := docSecrets(t)["proxyfleet-ssh"]
	for _, h := range cfg.Hosts {
		for _, f := range []string{h.SSH.KeyFile, h.SSH.KnownHosts} {
			if sshMount == "" || path.Dir(f) != sshMount {
				t.Errorf("host %s: %s is not in the worker's SSH secret mount %q", h.Name, f, sshMount)
			}
			if !slices.Contains(sshKeys, path.Base(f)) {
				t.Errorf("host %s: %s is not a key of the secret proxyfleet-ssh docs/OPERATIONS.md makes (%v)", h.Name, f, sshKeys)
			}
		}
	}
}

// checkK8sSelectors checks that the budgets, the services and the
// ServiceMonitor select what they are for.
func checkK8sSelectors(t *testing.T, m manifests) {
	t.Helper()
	podLabels := func(role string) map[string]string { return m.deployments[role].Spec.Template.Labels }
	covered := map[string]bool{}
	for _, p := range m.pdbs {
		for _, r := range []string{"worker", "health"} {
			if selects(t, p.Spec.Selector, podLabels(r)) {
				covered[r] = true
			}
		}
	}
	if !covered["worker"] || !covered["health"] {
		t.Errorf("PodDisruptionBudgets cover %v, want worker and health", covered)
	}
	scraped := map[string]bool{}
	for _, sm := range m.monitors {
		for _, s := range m.services {
			if !selects(t, &sm.Spec.Selector, s.Labels) {
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				for _, sp := range s.Spec.Ports {
					if sp.Name != ep.Port {
						continue
					}
					for _, r := range []string{"worker", "health", "pools"} {
						if !selects(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, podLabels(r)) {
							continue
						}
						cs := m.deployments[r].Spec.Template.Spec.Containers
						if len(cs) > 0 && ep.Path == "/metrics" && slices.ContainsFunc(cs[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == sp.TargetPort.String() }) {
							scraped[r] = true
						}
					}
				}
			}
		}
	}
	if !scraped["worker"] || !scraped["health"] || !scraped["pools"] {
		t.Errorf("the ServiceMonitor scrapes /metrics of %v, want worker, health and pools", scraped)
	}
}
