package check

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const (
	baseDir      = "deploy/base"
	overlayDir   = "deploy/overlays/example"
	adyenDir     = "deploy/overlays/adyen"
	exampleFile  = "deploy/overlays/example/secret.example.yaml"
	placeholder  = "CHANGE_ME"
	httpShutdown = 5 * time.Second // serve's HTTP shutdown timeout after the drain
)

// newObject returns an empty object of a manifest's apiVersion and kind.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + "/" + kind {
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1/Secret":
		return &corev1.Secret{}, true
	case "v1/Service":
		return &corev1.Service{}, true
	case "v1/ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1/Namespace":
		return &corev1.Namespace{}, true
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, true
	case "batch/v1/Job":
		return &batchv1.Job{}, true
	case "batch/v1/CronJob":
		return &batchv1.CronJob{}, true
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "networking.k8s.io/v1/Ingress":
		return &networkingv1.Ingress{}, true
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, true
	case "monitoring.coreos.com/v1/PrometheusRule":
		return &monitoringv1.PrometheusRule{}, true
	case "kustomize.config.k8s.io/v1beta1/Kustomization":
		return &kusttypes.Kustomization{}, true
	case "kafka.strimzi.io/v1beta2/KafkaTopic":
		return &kafkaTopic{}, true
	case "kafka.strimzi.io/v1beta2/KafkaUser":
		return &kafkaUser{}, true
	case "postgresql.cnpg.io/v1/Pooler":
		return &cnpgPooler{}, true
	}
	return nil, false
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// decodeStrict decodes every document of a YAML stream into its typed
// object, rejecting unknown fields and duplicate keys.
func decodeStrict(data []byte) ([]any, error) {
	var out []any
	for i, doc := range docSeparator.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		obj, ok := newObject(tm.APIVersion, tm.Kind)
		if !ok {
			return nil, fmt.Errorf("document %d: no type known for %s %s; add it to deploy/check", i, tm.APIVersion, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i, tm.Kind, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// manifestFiles lists the Kubernetes YAML files under deploy/: everything
// but compose's configuration and this module.
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(path("deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "compose" || d.Name() == "check") {
			return filepath.SkipDir
		}
		if ext := filepath.Ext(p); ext == ".yaml" || ext == ".yml" {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no manifests under deploy/")
	}
	return files
}

func TestManifests_DecodeStrictlyIntoTheirTypes(t *testing.T) {
	for _, f := range manifestFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeStrict(b)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(objs) == 0 {
			t.Errorf("%s: no manifest", f)
		}
	}
}

func TestKustomizations_ListFilesThatExist(t *testing.T) {
	for _, f := range manifestFiles(t) {
		if filepath.Base(f) != "kustomization.yaml" {
			continue
		}
		var k kusttypes.Kustomization
		readStrict(t, f, &k)
		dir := filepath.Dir(f)
		var listed []string
		listed = append(listed, k.Resources...)
		listed = append(listed, k.Components...)
		for _, p := range k.Patches {
			if p.Path != "" {
				listed = append(listed, p.Path)
			}
		}
		var generators []kusttypes.GeneratorArgs
		for _, g := range k.ConfigMapGenerator {
			generators = append(generators, g.GeneratorArgs)
		}
		for _, g := range k.SecretGenerator {
			generators = append(generators, g.GeneratorArgs)
		}
		for _, g := range generators {
			for _, file := range g.FileSources {
				_, src, ok := strings.Cut(file, "=")
				if !ok {
					src = file
				}
				listed = append(listed, src)
			}
			listed = append(listed, g.EnvSources...)
		}
		for _, l := range listed {
			if strings.Contains(l, "://") {
				t.Errorf("%s: remote %s cannot be checked offline; vendor it", f, l)
				continue
			}
			p := filepath.Join(dir, l)
			st, err := os.Stat(p)
			if err != nil {
				t.Errorf("%s lists %s, which does not exist", f, l)
				continue
			}
			if st.IsDir() && !exists(filepath.Join(p, "kustomization.yaml")) {
				t.Errorf("%s lists directory %s, which has no kustomization.yaml", f, l)
			}
		}
		if strings.HasPrefix(f, path(overlayDir)) {
			for _, l := range listed {
				if strings.Contains(filepath.Base(l), "example") {
					t.Errorf("%s applies %s: example Secrets must never be applied", f, l)
				}
			}
		}
	}
}

func readStrict(t *testing.T, p string, into any) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
}

// rendered is the output of a kustomize build, decoded strictly.
type rendered struct {
	name            string
	deployments     []*appsv1.Deployment
	jobs            []*batchv1.Job
	cronJobs        []*batchv1.CronJob
	configMaps      map[string]*corev1.ConfigMap
	secrets         []*corev1.Secret
	services        []*corev1.Service
	pdbs            []*policyv1.PodDisruptionBudget
	networkPolicies []*networkingv1.NetworkPolicy
	ingresses       []*networkingv1.Ingress
	serviceMonitors []*monitoringv1.ServiceMonitor
	rules           []*monitoringv1.PrometheusRule
	namespaced      []metav1.Object
	objects         []any // all of the above, and what has no field of its own
}

// build renders a kustomization with kustomize's library, as
// `kubectl kustomize` does, and decodes the result strictly.
func build(t *testing.T, dir string) *rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	abs, err := filepath.Abs(path(dir))
	if err != nil {
		t.Fatal(err)
	}
	m, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(out)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	r := &rendered{name: dir, configMaps: map[string]*corev1.ConfigMap{}, objects: objs}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			r.deployments = append(r.deployments, o)
		case *batchv1.Job:
			r.jobs = append(r.jobs, o)
		case *batchv1.CronJob:
			r.cronJobs = append(r.cronJobs, o)
		case *corev1.ConfigMap:
			r.configMaps[o.Name] = o
		case *corev1.Secret:
			r.secrets = append(r.secrets, o)
		case *corev1.Service:
			r.services = append(r.services, o)
		case *policyv1.PodDisruptionBudget:
			r.pdbs = append(r.pdbs, o)
		case *networkingv1.NetworkPolicy:
			r.networkPolicies = append(r.networkPolicies, o)
		case *networkingv1.Ingress:
			r.ingresses = append(r.ingresses, o)
		case *monitoringv1.ServiceMonitor:
			r.serviceMonitors = append(r.serviceMonitors, o)
		case *monitoringv1.PrometheusRule:
			r.rules = append(r.rules, o)
		}
		if mo, ok := o.(metav1.Object); ok {
			if _, isNS := o.(*corev1.Namespace); !isNS {
				r.namespaced = append(r.namespaced, mo)
			}
		}
	}
	return r
}

// serveDeployment returns the one Deployment, which runs billing serve.
func (r *rendered) serveDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	if len(r.deployments) != 1 {
		t.Fatalf("%s renders %d Deployments, want 1", r.name, len(r.deployments))
	}
	return r.deployments[0]
}

// exampleSecrets reads the example overlay's Secrets: name → key → value.
func exampleSecrets(t *testing.T) map[string]map[string]string {
	t.Helper()
	b, err := os.ReadFile(path(exampleFile))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeStrict(b)
	if err != nil {
		t.Fatalf("%s: %v", exampleFile, err)
	}
	out := map[string]map[string]string{}
	for _, o := range objs {
		s, ok := o.(*corev1.Secret)
		if !ok {
			t.Fatalf("%s holds a %T, want Secrets only", exampleFile, o)
		}
		data := map[string]string{}
		for k, v := range s.StringData {
			data[k] = v
		}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		out[s.Name] = data
	}
	return out
}

// podEnv is the environment a container gets, resolved from the render.
type podEnv struct {
	env        map[string]string // variable → value (placeholders for refs)
	fromSecret map[string]bool   // variables taken from a Secret
	fromField  map[string]string // variable → fieldRef path
}

// resolveEnv resolves c's env and envFrom against the rendered ConfigMaps
// and secrets (name → key → value; a missing optional key is left unset, a
// missing required one gets a placeholder).
func resolveEnv(t *testing.T, where string, r *rendered, c corev1.Container, secrets map[string]map[string]string) podEnv {
	t.Helper()
	pe := podEnv{env: map[string]string{}, fromSecret: map[string]bool{}, fromField: map[string]string{}}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, ok := r.configMaps[ef.ConfigMapRef.Name]
			if !ok {
				t.Errorf("%s: envFrom ConfigMap %s is not rendered", where, ef.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				pe.env[ef.Prefix+k] = v
			}
		case ef.SecretRef != nil:
			for k, v := range secrets[ef.SecretRef.Name] {
				pe.env[ef.Prefix+k] = v
				pe.fromSecret[ef.Prefix+k] = true
			}
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			pe.env[e.Name] = e.Value
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := r.configMaps[ref.Name]
			if !ok {
				t.Errorf("%s: %s from ConfigMap %s, which is not rendered", where, e.Name, ref.Name)
				continue
			}
			v, ok := cm.Data[ref.Key]
			if !ok && (ref.Optional == nil || !*ref.Optional) {
				t.Errorf("%s: %s from ConfigMap %s key %s, which it lacks", where, e.Name, ref.Name, ref.Key)
			}
			if ok {
				pe.env[e.Name] = v
			}
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			pe.fromSecret[e.Name] = true
			if v, ok := secrets[ref.Name][ref.Key]; ok {
				pe.env[e.Name] = v
			} else if ref.Optional == nil || !*ref.Optional {
				pe.env[e.Name] = "placeholder"
				if e.Name == "DATABASE_URL" {
					pe.env[e.Name] = "postgres://billing:placeholder@db:5432/billing?sslmode=verify-full"
				}
			}
		case e.ValueFrom.FieldRef != nil:
			pe.fromField[e.Name] = e.ValueFrom.FieldRef.FieldPath
			pe.env[e.Name] = "billing-7d9f8c6b5-x2x4q"
		case e.ValueFrom.ResourceFieldRef != nil:
			pe.env[e.Name] = "536870912"
		}
	}
	return pe
}

// checkPod checks what every billing pod must be and returns the first
// container's command and environment.
func checkPod(t *testing.T, where string, r *rendered, spec corev1.PodSpec, secrets map[string]map[string]string) (string, podEnv, corev1.Container) {
	t.Helper()
	b := bin(t)
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: %d containers, want 1", where, len(spec.Containers))
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s mounts a service account token billing never uses", where)
	}
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	c := spec.Containers[0]
	csc := c.SecurityContext
	if csc == nil {
		t.Fatalf("%s: container %s has no securityContext", where, c.Name)
	}
	if !isTrue(csc.RunAsNonRoot) && !isTrue(psc.RunAsNonRoot) {
		t.Errorf("%s: runAsNonRoot is not set", where)
	}
	for _, uid := range []*int64{psc.RunAsUser, csc.RunAsUser} {
		if uid != nil && *uid == 0 {
			t.Errorf("%s runs as root", where)
		}
	}
	if !isTrue(csc.ReadOnlyRootFilesystem) {
		t.Errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	if csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") || len(csc.Capabilities.Add) > 0 {
		t.Errorf("%s: capabilities are not all dropped", where)
	}
	seccomp := psc.SeccompProfile
	if csc.SeccompProfile != nil {
		seccomp = csc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: seccomp profile is not RuntimeDefault", where)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: set cpu and memory requests and a memory limit", where)
	}
	if len(c.Command) > 0 {
		t.Errorf("%s overrides the image's entrypoint /billing with %v", where, c.Command)
	}
	cmd := requireCommand(t, where, c.Args, false)

	pe := resolveEnv(t, where, r, c, secrets)
	requireVars(t, where, cmd, sortedKeys(pe.env))
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !b.Reads(cmd, e.Name) {
			t.Errorf("%s takes %s from a Secret, which billing does not read", where, e.Name)
		}
	}
	for _, s := range SecretVars {
		if _, set := pe.env[s]; set && !pe.fromSecret[s] {
			t.Errorf("%s: %s must come from a Secret, not a literal or a ConfigMap", where, s)
		}
	}

	// Files named by the environment must be mounted.
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		if _, ok := volumes[m.Name]; !ok {
			t.Errorf("%s mounts volume %s, which the pod lacks", where, m.Name)
		}
	}
	for _, fv := range fileVars {
		p := pe.env[fv]
		if p == "" || !CommandVars(cmd)[fv] {
			continue
		}
		var m *corev1.VolumeMount
		for mp, mm := range mounts {
			if strings.HasPrefix(p, strings.TrimSuffix(mp, "/")+"/") {
				m = &mm
			}
		}
		if m == nil {
			t.Errorf("%s: %s=%s is under no volume mount", where, fv, p)
			continue
		}
		if v := volumes[m.Name]; v.Secret != nil && secrets != nil {
			key := strings.TrimPrefix(p, strings.TrimSuffix(m.MountPath, "/")+"/")
			if _, ok := secrets[v.Secret.SecretName][key]; !ok {
				t.Errorf("%s: %s=%s, but the example Secret %s has no key %s", where, fv, p, v.Secret.SecretName, key)
			}
		}
	}
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		mode := int32(0o644)
		if v.Secret.DefaultMode != nil {
			mode = *v.Secret.DefaultMode
		}
		if mode&0o004 == 0 && (psc.FSGroup == nil || mode&0o040 == 0) {
			t.Errorf("%s: Secret volume %s (mode %o) is unreadable by a non-root user without fsGroup", where, v.Name, mode)
		}
		if secrets != nil {
			if _, ok := secrets[v.Secret.SecretName]; !ok && !isTrue(v.Secret.Optional) {
				t.Errorf("%s mounts Secret %s, which the example Secrets do not show", where, v.Secret.SecretName)
			}
		}
	}

	// billing's own validation accepts the environment, as at start.
	if err := ValidateConfig(cmd, pe.env, anyFile(t)); err != nil {
		t.Errorf("%s: billing %s would refuse to start: %v", where, cmd, err)
	}
	return cmd, pe, c
}

func isTrue(b *bool) bool { return b != nil && *b }

// containerPort resolves a probe's or Service's port (name or number) to a
// container port number.
func containerPort(c corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// checkRender runs every check on one rendered kustomization; secrets are
// the Secrets the pods get (nil: only required keys, as placeholders).
func checkRender(t *testing.T, r *rendered, secrets map[string]map[string]string) {
	dep := r.serveDeployment(t)
	where := "Deployment " + dep.Name
	cmd, pe, c := checkPod(t, where, r, dep.Spec.Template.Spec, secrets)
	if cmd != "serve" {
		t.Fatalf("%s runs billing %s, want serve", where, cmd)
	}
	podLabels := labels.Set(dep.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("%s: selector does not match its pods (%v)", where, err)
	}

	// Probes: /healthz and /readyz on the port HTTP_ADDR listens on.
	httpPort, err := port(serveVar(t, pe.env, "HTTP_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"livenessProbe", c.LivenessProbe, "/healthz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s", where, pr.name)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path {
			t.Errorf("%s: %s on %s, want %s", where, pr.name, pr.probe.HTTPGet.Path, pr.path)
		}
		if p, ok := containerPort(c, pr.probe.HTTPGet.Port); !ok || int(p) != httpPort {
			t.Errorf("%s: %s on port %s (%d), but HTTP_ADDR listens on %d", where, pr.name, pr.probe.HTTPGet.Port.String(), p, httpPort)
		}
	}
	if c.LivenessProbe != nil && c.LivenessProbe.HTTPGet != nil && c.LivenessProbe.HTTPGet.Path == "/readyz" {
		t.Errorf("%s: liveness must not depend on Kafka and PostgreSQL", where)
	}

	// Shutdown: the grace period covers the drain and the HTTP shutdown.
	drain := durationVar(t, pe.env, "DRAIN_TIMEOUT")
	grace := time.Duration(0)
	if g := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if grace <= drain+httpShutdown {
		t.Errorf("%s: terminationGracePeriodSeconds %s does not exceed DRAIN_TIMEOUT %s + %s", where, grace, drain, httpShutdown)
	}
	if pe.fromField["KAFKA_INSTANCE_ID"] != "metadata.name" {
		t.Errorf("%s: KAFKA_INSTANCE_ID does not come from the pod name (downward API)", where)
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("%s: fewer than 2 replicas", where)
	}

	// The billing ConfigMap holds only variables serve reads, and no secret.
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		cm := r.configMaps[ef.ConfigMapRef.Name]
		if cm == nil {
			continue
		}
		for k := range cm.Data {
			if !bin(t).Reads("serve", k) {
				t.Errorf("ConfigMap %s sets %s, which billing serve does not read", cm.Name, k)
			}
			if slices.Contains(SecretVars, k) {
				t.Errorf("ConfigMap %s holds the secret %s", cm.Name, k)
			}
		}
	}

	// The Job migrates; the CronJob maintains, one run at a time.
	var jobs []string
	for _, j := range r.jobs {
		cmd, _, _ := checkPod(t, "Job "+j.Name, r, j.Spec.Template.Spec, secrets)
		jobs = append(jobs, cmd)
	}
	if !slices.Equal(jobs, []string{"migrate"}) {
		t.Errorf("Jobs run %v, want [migrate]", jobs)
	}
	var crons []string
	for _, cj := range r.cronJobs {
		cmd, pe, _ := checkPod(t, "CronJob "+cj.Name, r, cj.Spec.JobTemplate.Spec.Template.Spec, secrets)
		crons = append(crons, cmd)
		if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
			t.Errorf("CronJob %s: concurrencyPolicy %q, want Forbid", cj.Name, cj.Spec.ConcurrencyPolicy)
		}
		for _, v := range []string{"DATABASE_URL", "DEDUP_RETENTION"} {
			if _, ok := pe.env[v]; !ok {
				t.Errorf("CronJob %s does not set %s", cj.Name, v)
			}
		}
		if got, want := pe.env["DEDUP_RETENTION"], serveVar(t, resolveEnv(t, where, r, c, secrets).env, "DEDUP_RETENTION"); got != want {
			t.Errorf("CronJob %s keeps DEDUP_RETENTION %s, serve %s", cj.Name, got, want)
		}
	}
	if !slices.Equal(crons, []string{"maintain"}) {
		t.Errorf("CronJobs run %v, want [maintain]", crons)
	}

	// Two listeners: HTTP_ADDR (probes, /metrics) stays inside the cluster,
	// WEBHOOK_ADDR (the provider's notifications) is the one published.
	webhookPort, err := port(serveVar(t, pe.env, "WEBHOOK_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	if webhookPort == httpPort {
		t.Errorf("%s: WEBHOOK_ADDR and HTTP_ADDR share port %d", where, httpPort)
	}
	if p, ok := containerPort(c, intstr.FromString("webhooks")); !ok || int(p) != webhookPort {
		t.Errorf("%s: no container port named webhooks on WEBHOOK_ADDR's port %d", where, webhookPort)
	}

	// One Service exposes the HTTP port, which the ServiceMonitor scrapes;
	// another the webhook port; none both.
	var metricsSvc, webhookSvc *corev1.Service
	for _, s := range r.services {
		if len(s.Spec.Selector) == 0 || !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) {
			continue
		}
		var targets []int
		for _, sp := range s.Spec.Ports {
			p, ok := containerPort(c, sp.TargetPort)
			if !ok {
				t.Errorf("Service %s port %s targets %s, which the container does not declare", s.Name, sp.Name, sp.TargetPort.String())
				continue
			}
			targets = append(targets, int(p))
		}
		switch http, hooks := slices.Contains(targets, httpPort), slices.Contains(targets, webhookPort); {
		case http && hooks:
			t.Errorf("Service %s exposes both HTTP_ADDR's port %d (internal) and WEBHOOK_ADDR's port %d (the provider's)", s.Name, httpPort, webhookPort)
		case http && metricsSvc != nil:
			t.Errorf("Services %s and %s both expose HTTP_ADDR's port %d", metricsSvc.Name, s.Name, httpPort)
		case http:
			metricsSvc = s
		case hooks:
			webhookSvc = s
		default:
			t.Errorf("Service %s exposes neither HTTP_ADDR's port %d nor WEBHOOK_ADDR's port %d", s.Name, httpPort, webhookPort)
		}
	}
	if metricsSvc == nil {
		t.Fatalf("no Service exposes the billing pods' HTTP_ADDR port %d", httpPort)
	}
	if webhookSvc == nil {
		t.Errorf("no Service exposes the billing pods' WEBHOOK_ADDR port %d for the provider's webhooks", webhookPort)
	}
	if metricsSvc.Name != "billing" {
		t.Errorf("the metrics Service is %s; the alerts and dashboard expect job=\"billing\"", metricsSvc.Name)
	}
	svcPorts := map[string]corev1.ServicePort{}
	for _, sp := range metricsSvc.Spec.Ports {
		svcPorts[sp.Name] = sp
		if p, ok := containerPort(c, sp.TargetPort); !ok || int(p) != httpPort {
			t.Errorf("Service %s port %s targets %s, not the HTTP_ADDR port %d", metricsSvc.Name, sp.Name, sp.TargetPort.String(), httpPort)
		}
	}
	if len(r.serviceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(r.serviceMonitors))
	}
	sm := r.serviceMonitors[0]
	smSel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil || !smSel.Matches(labels.Set(metricsSvc.Labels)) {
		t.Errorf("ServiceMonitor %s does not select Service %s (%v)", sm.Name, metricsSvc.Name, err)
	}
	if webhookSvc != nil && smSel.Matches(labels.Set(webhookSvc.Labels)) {
		t.Errorf("ServiceMonitor %s also selects the webhooks Service %s: give it another component label", sm.Name, webhookSvc.Name)
	}
	for _, ep := range sm.Spec.Endpoints {
		if _, ok := svcPorts[ep.Port]; !ok {
			t.Errorf("ServiceMonitor %s scrapes port %q, which Service %s lacks", sm.Name, ep.Port, metricsSvc.Name)
		}
		if ep.Path != "" && ep.Path != "/metrics" {
			t.Errorf("ServiceMonitor %s scrapes %s, want /metrics", sm.Name, ep.Path)
		}
	}

	// The PodDisruptionBudget covers the pods and lets one go at a time.
	if len(r.pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(r.pdbs))
	}
	pdbSel, err := metav1.LabelSelectorAsSelector(r.pdbs[0].Spec.Selector)
	if err != nil || !pdbSel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget %s does not select the billing pods", r.pdbs[0].Name)
	}
	if r.pdbs[0].Spec.MaxUnavailable == nil && r.pdbs[0].Spec.MinAvailable == nil {
		t.Errorf("PodDisruptionBudget %s sets neither maxUnavailable nor minAvailable", r.pdbs[0].Name)
	}

	checkNetworkPolicies(t, r, c, podLabels, httpPort, webhookPort)
	checkIngresses(t, r, metricsSvc, webhookSvc, serveVar(t, pe.env, "PAYMENT_PROVIDER"))
	checkRules(t, r)
	checkDashboardConfigMap(t, r)
}

// checkNetworkPolicies requires every billing pod to be isolated with DNS
// egress, the consumer's HTTP port open to the monitoring namespace, and
// its webhook port to some peer (the ingress controller), never in one
// rule with the HTTP port, and no rule admitting every port or the HTTP
// port from anywhere.
func checkNetworkPolicies(t *testing.T, r *rendered, c corev1.Container, podLabels labels.Set, httpPort, webhookPort int) {
	t.Helper()
	selecting := func(l labels.Set) []*networkingv1.NetworkPolicy {
		var out []*networkingv1.NetworkPolicy
		for _, np := range r.networkPolicies {
			s, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err == nil && s.Matches(l) {
				out = append(out, np)
			}
		}
		return out
	}
	pods := map[string]labels.Set{"the Deployment's pods": podLabels}
	for _, j := range r.jobs {
		pods["Job "+j.Name] = j.Spec.Template.Labels
	}
	for _, cj := range r.cronJobs {
		pods["CronJob "+cj.Name] = cj.Spec.JobTemplate.Spec.Template.Labels
	}
	for what, l := range pods {
		nps := selecting(l)
		if len(nps) == 0 {
			t.Errorf("no NetworkPolicy selects %s", what)
			continue
		}
		dns := false
		for _, np := range nps {
			for _, e := range np.Spec.Egress {
				for _, p := range e.Ports {
					dns = dns || (p.Port != nil && p.Port.IntValue() == 53)
				}
			}
		}
		if !dns {
			t.Errorf("the NetworkPolicies of %s allow no DNS egress", what)
		}
	}
	open, hooks := false, false
	for _, np := range selecting(podLabels) {
		for _, in := range np.Spec.Ingress {
			fromMonitoring, fromAnywhere := false, len(in.From) == 0
			for _, peer := range in.From {
				if peer.NamespaceSelector != nil && peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == "monitoring" {
					fromMonitoring = true
				}
				fromAnywhere = fromAnywhere || peer.IPBlock != nil
			}
			if len(in.Ports) == 0 {
				t.Errorf("NetworkPolicy %s admits every port of the billing pods; name the ports", np.Name)
			}
			var ports []int
			for _, p := range in.Ports {
				if p.Port == nil {
					t.Errorf("NetworkPolicy %s admits a rule without a port; name the ports", np.Name)
					continue
				}
				if cp, ok := containerPort(c, *p.Port); ok {
					ports = append(ports, int(cp))
				}
			}
			http, webhooks := slices.Contains(ports, httpPort), slices.Contains(ports, webhookPort)
			open = open || (http && fromMonitoring)
			hooks = hooks || webhooks
			if http && webhooks {
				t.Errorf("NetworkPolicy %s admits the webhook port %d and the internal HTTP port %d in one rule: the provider's path must reach the webhook port only", np.Name, webhookPort, httpPort)
			}
			if http && fromAnywhere {
				t.Errorf("NetworkPolicy %s admits the internal HTTP port %d from anywhere", np.Name, httpPort)
			}
		}
	}
	if !open {
		t.Errorf("no NetworkPolicy lets the monitoring namespace reach port %d", httpPort)
	}
	if !hooks {
		t.Errorf("no NetworkPolicy lets anything reach the webhook port %d: the provider's notifications cannot come in", webhookPort)
	}
}

// checkIngresses requires every Ingress that routes to billing to route
// only POST /webhooks/<PAYMENT_PROVIDER> to the webhooks Service, with TLS
// for its hosts: the internal HTTP_ADDR listener is never published. A
// provider that posts from outside the cluster (stripe, adyen) must have
// its path routed; the contract's provider may run beside billing.
func checkIngresses(t *testing.T, r *rendered, metricsSvc, webhookSvc *corev1.Service, provider string) {
	t.Helper()
	want := "/webhooks/" + provider
	routed := false
	defer func() {
		if !routed && provider != "contract" {
			t.Errorf("%s: no Ingress routes %s to the webhooks Service: with PAYMENT_PROVIDER=%s the provider's notifications cannot come in", r.name, want, provider)
		}
	}()
	for _, ing := range r.ingresses {
		where := "Ingress " + ing.Name
		backends := []*networkingv1.IngressBackend{ing.Spec.DefaultBackend}
		tls := map[string]bool{}
		for _, tl := range ing.Spec.TLS {
			for _, h := range tl.Hosts {
				tls[h] = true
			}
		}
		for _, rule := range ing.Spec.Rules {
			if !tls[rule.Host] {
				t.Errorf("%s: host %q has no TLS: the provider posts over HTTPS", where, rule.Host)
			}
			if rule.HTTP == nil {
				continue
			}
			for _, p := range rule.HTTP.Paths {
				backends = append(backends, &p.Backend)
				if p.Path != want {
					t.Errorf("%s routes %s; billing's webhook listener serves %s (PAYMENT_PROVIDER=%s) only", where, p.Path, want, provider)
				}
			}
		}
		for _, b := range backends {
			if b == nil || b.Service == nil {
				continue
			}
			if metricsSvc != nil && b.Service.Name == metricsSvc.Name {
				t.Errorf("%s publishes the internal Service %s (/healthz, /readyz, /metrics)", where, metricsSvc.Name)
				continue
			}
			if webhookSvc == nil || b.Service.Name != webhookSvc.Name {
				t.Errorf("%s routes to Service %s, not to the webhooks Service", where, b.Service.Name)
				continue
			}
			found := false
			for _, sp := range webhookSvc.Spec.Ports {
				found = found || (b.Service.Port.Name != "" && sp.Name == b.Service.Port.Name) || (b.Service.Port.Number != 0 && sp.Port == b.Service.Port.Number)
			}
			if !found {
				t.Errorf("%s routes to port %v of Service %s, which it lacks", where, b.Service.Port, webhookSvc.Name)
			}
		}
		for _, rule := range ing.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			for _, p := range rule.HTTP.Paths {
				if p.Path == want && p.Backend.Service != nil && webhookSvc != nil && p.Backend.Service.Name == webhookSvc.Name {
					routed = true
				}
			}
		}
	}
}

// docSection is a pointer from an alert's annotations to a section of
// billing's documentation: docs/operations.md "Runbook: an outage".
var docSection = regexp.MustCompile(`docs/([a-z]+)\.md "([^"]+)"`)

// docHeadings returns the headings of a Markdown file of docs/, outside
// code blocks, as written (without the #s).
func docHeadings(t *testing.T, name string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path("docs", name+".md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(line, "#") {
			out[strings.TrimSpace(strings.TrimLeft(line, "#"))] = true
		}
	}
	return out
}

// checkRules requires every alert to use metrics billing exports (or the
// standard up and kube-state-metrics series), to say how bad and what, to
// be named in docs/operations.md, and to point to the section of it that
// says what to do (docs/operations.md "<heading>").
func checkRules(t *testing.T, r *rendered) {
	t.Helper()
	if len(r.rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(r.rules))
	}
	standard := func(n string) bool { return n == "up" || strings.HasPrefix(n, "kube_") }
	operations, err := os.ReadFile(path("docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]map[string]bool{}
	used := map[string]bool{}
	for _, g := range r.rules[0].Spec.Groups {
		for _, rule := range g.Rules {
			where := "alert " + rule.Alert
			if rule.Alert == "" {
				where = "recording rule " + rule.Record
			}
			for _, n := range requireMetrics(t, where, rule.Expr.String(), standard) {
				used[n] = true
			}
			if rule.Alert == "" {
				continue
			}
			if rule.Labels["severity"] == "" || rule.Annotations["summary"] == "" {
				t.Errorf("%s lacks a severity label or a summary annotation", where)
			}
			if !strings.Contains(string(operations), "`"+rule.Alert+"`") {
				t.Errorf("%s is not named in docs/operations.md", where)
			}
			runbook := false
			for _, a := range rule.Annotations {
				for _, m := range docSection.FindAllStringSubmatch(a, -1) {
					if headings[m[1]] == nil {
						headings[m[1]] = docHeadings(t, m[1])
					}
					if !headings[m[1]][m[2]] {
						t.Errorf("%s points to docs/%s.md %q, which has no such heading", where, m[1], m[2])
					}
					runbook = runbook || m[1] == "operations"
				}
			}
			if !runbook {
				t.Errorf(`%s points to no section of docs/operations.md (docs/operations.md "<heading>")`, where)
			}
		}
	}
	// Lag growing, DLQ writes, payment failures and retries, no ready
	// replicas, provider outage; attempts a human must settle, payments in
	// progress for days, webhooks refused.
	for _, m := range []string{"billing_consumer_lag", "billing_dlq_messages_total", "billing_payment_requests_total", "billing_retries_total", "kube_deployment_status_replicas_available",
		"billing_charge_attempts_unresolved", "billing_charge_attempts_oldest_in_progress_seconds", "billing_webhooks_total"} {
		if !used[m] {
			t.Errorf("no alert on %s", m)
		}
	}
}

// checkDashboardConfigMap requires the rendered dashboard ConfigMap to
// carry the dashboard file compose mounts.
func checkDashboardConfigMap(t *testing.T, r *rendered) {
	t.Helper()
	want, err := os.ReadFile(path(dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range r.configMaps {
		if cm.Labels["grafana_dashboard"] == "" {
			continue
		}
		for _, v := range cm.Data {
			if v == string(want) {
				return
			}
		}
	}
	t.Errorf("no ConfigMap labelled grafana_dashboard carries %s", dashboardFile)
}

func TestKustomize_BaseRendersAndMatchesTheBinary(t *testing.T) {
	r := build(t, baseDir)
	checkRender(t, r, nil)
	if n := *r.serveDeployment(t).Spec.Replicas; n != 3 {
		t.Errorf("the base runs %d replicas, want 3", n)
	}
}

func TestKustomize_ExampleOverlayRendersAndMatchesTheBinary(t *testing.T) {
	r := build(t, overlayDir)
	secrets := exampleSecrets(t)
	checkRender(t, r, secrets)

	// Secrets are never rendered: the overlay references them only.
	if len(r.secrets) > 0 {
		t.Errorf("the overlay renders %d Secrets; it must only reference them", len(r.secrets))
	}
	for _, o := range r.namespaced {
		if o.GetNamespace() == "" {
			t.Errorf("%s has no namespace", o.GetName())
		}
	}
	// Every Secret reference is shown in the example, with placeholders.
	dep := r.serveDeployment(t)
	var pods []corev1.PodSpec
	pods = append(pods, dep.Spec.Template.Spec)
	for _, j := range r.jobs {
		pods = append(pods, j.Spec.Template.Spec)
	}
	for _, cj := range r.cronJobs {
		pods = append(pods, cj.Spec.JobTemplate.Spec.Template.Spec)
	}
	for _, p := range pods {
		for _, c := range p.Containers {
			for _, e := range c.Env {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				if _, ok := secrets[ref.Name][ref.Key]; !ok {
					t.Errorf("%s takes %s from Secret %s key %s, which %s does not show", c.Name, e.Name, ref.Name, ref.Key, exampleFile)
				}
			}
			if img := c.Image; !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest") {
				t.Errorf("container %s runs image %q; pin a version", c.Name, img)
			}
		}
	}
	for name, data := range secrets {
		for k, v := range data {
			if !strings.Contains(v, placeholder) && k != "KAFKA_SASL_USERNAME" {
				t.Errorf("%s: Secret %s key %s holds no %s placeholder: never commit real values", exampleFile, name, k, placeholder)
			}
		}
	}
}

// adyenHMACKey stands for the example's PAYMENT_WEBHOOK_SECRET placeholder
// when the Adyen overlay is checked: billing refuses an Adyen HMAC key that
// is not hex, as the placeholder is not.
const adyenHMACKey = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF"

// The Adyen overlay is the example on Adyen: every check of the example
// holds for it, with Adyen's configuration validated by billing's own
// (ADYEN_MERCHANT_ACCOUNT, the Checkout root with its version, the HMAC
// key in hex) and /webhooks/adyen, not /webhooks/stripe, published.
func TestKustomize_AdyenOverlayRendersAndMatchesTheBinary(t *testing.T) {
	r := build(t, adyenDir)
	secrets := exampleSecrets(t)
	secrets["billing-secrets"]["PAYMENT_WEBHOOK_SECRET"] = adyenHMACKey
	checkRender(t, r, secrets)
	if len(r.secrets) > 0 {
		t.Errorf("the Adyen overlay renders %d Secrets; it must only reference them", len(r.secrets))
	}
	cm := r.configMaps["billing-config"]
	if cm == nil {
		t.Fatal("the Adyen overlay renders no ConfigMap billing-config")
	}
	if got := cm.Data["PAYMENT_PROVIDER"]; got != "adyen" {
		t.Errorf("the Adyen overlay sets PAYMENT_PROVIDER=%q, want adyen", got)
	}
	for _, v := range []string{"PAYMENT_BASE_URL", "ADYEN_MERCHANT_ACCOUNT"} {
		if cm.Data[v] == "" {
			t.Errorf("the Adyen overlay leaves %s unset: billing serve requires it with adyen", v)
		}
	}
	// The CronJob maintains without asking Adyen (no PAYMENT_BASE_URL),
	// and billing's validation accepts ADYEN_MERCHANT_ACCOUNT there, as
	// checkRender showed; the example itself stays on Stripe.
	if got := build(t, overlayDir).configMaps["billing-config"].Data["PAYMENT_PROVIDER"]; got != "stripe" {
		t.Errorf("the example overlay sets PAYMENT_PROVIDER=%q; it goes live on Stripe, the Adyen overlay on Adyen", got)
	}
}
