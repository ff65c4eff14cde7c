package check

import (
	"cmp"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"

	"example.com/billing/internal/config"
)

// The images docker-compose.yml builds from this repository: the one that
// ships, and the developer build's (the Dockerfile's target dev).
const (
	billingImage    = "billing:local"
	billingDevImage = "billing:local-dev"
	devTarget       = "dev"
)

// loadCompose loads docker-compose.yml with compose-go, every profile
// enabled, validating it against the compose specification's schema, with
// no environment of the machine running the test.
func loadCompose(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{path("docker-compose.yml")},
		cli.WithWorkingDirectory(root),
		cli.WithProfiles([]string{"*"}),
		cli.WithEnv(nil),
		cli.WithInterpolation(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := opts.LoadProject(ctx)
	if err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return p
}

// environment returns a service's variables, unset ones as "".
func environment(s types.ServiceConfig) map[string]string {
	env := map[string]string{}
	for k, v := range s.Environment {
		env[k] = ""
		if v != nil {
			env[k] = *v
		}
	}
	return env
}

// billingServices maps each service that runs one of billing's images to
// the subcommand it runs.
func billingServices(t *testing.T, p *types.Project) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, s := range p.Services {
		if s.Image != billingImage && s.Image != billingDevImage {
			continue
		}
		target := ""
		if s.Build == nil {
			t.Errorf("service %s uses %s without building it", name, s.Image)
		} else {
			target = s.Build.Target
		}
		switch {
		case s.Image == billingImage && target != "":
			t.Errorf("service %s builds %s, the image that ships, from the Dockerfile's target %s: want its last stage (no target)", name, s.Image, target)
		case s.Image == billingDevImage && target != devTarget:
			t.Errorf("service %s builds %s, the developer build's image, from target %q: want %q", name, s.Image, target, devTarget)
		}
		if len(s.Entrypoint) > 0 {
			t.Errorf("service %s overrides the image's entrypoint /billing", name)
		}
		out[name] = requireCommand(t, "docker-compose.yml service "+name, s.Command, s.Image == billingDevImage)
	}
	return out
}

// serviceRunning returns the one service running `billing cmd`.
func serviceRunning(t *testing.T, p *types.Project, cmd string) types.ServiceConfig {
	t.Helper()
	var found []string
	for name, c := range billingServices(t, p) {
		if c == cmd {
			found = append(found, name)
		}
	}
	if len(found) != 1 {
		t.Fatalf("docker-compose.yml: %d services run `billing %s` (%v), want 1", len(found), cmd, found)
	}
	return p.Services[found[0]]
}

func TestCompose_LoadsAndValidates(t *testing.T) {
	p := loadCompose(t)
	for _, name := range []string{"kafka", "postgres", "billing"} {
		if _, ok := p.Services[name]; !ok {
			t.Errorf("no service %s", name)
		}
	}
	if img := p.Services["kafka"].Image; !strings.HasPrefix(img, "apache/kafka:") {
		t.Errorf("kafka runs %s, want the official apache/kafka image", img)
	}
	if img := p.Services["postgres"].Image; !strings.HasPrefix(img, "postgres:") {
		t.Errorf("postgres runs %s, want the official postgres image", img)
	}
	kenv := environment(p.Services["kafka"])
	if !strings.Contains(kenv["KAFKA_PROCESS_ROLES"], "controller") || kenv["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "" {
		t.Errorf("kafka is not a KRaft combined node: %v", kenv)
	}
}

func TestCompose_BillingServicesRunRealCommandsWithVariablesBillingReads(t *testing.T) {
	p := loadCompose(t)
	file := anyFile(t)
	services := billingServices(t, p)
	for _, want := range []string{"serve", "migrate", "fakepsp", "produce"} {
		if !slices.Contains(sortedValues(services), want) {
			t.Errorf("no service runs `billing %s`", want)
		}
	}
	for name, cmd := range services {
		s := p.Services[name]
		env := environment(s)
		requireVars(t, "docker-compose.yml service "+name, cmd, sortedKeys(env))
		if err := ValidateConfig(cmd, env, file); err != nil {
			t.Errorf("docker-compose.yml service %s: billing %s would refuse its environment: %v", name, cmd, err)
		}
		// The image has no shell and no curl: a healthcheck cannot run.
		if s.HealthCheck != nil && !s.HealthCheck.Disable && len(s.HealthCheck.Test) > 0 && s.HealthCheck.Test[0] != "NONE" {
			if s.HealthCheck.Test[0] != "CMD" || len(s.HealthCheck.Test) < 2 || s.HealthCheck.Test[1] != "/billing" {
				t.Errorf("service %s: healthcheck %v cannot run in the distroless image (no shell, no curl)", name, s.HealthCheck.Test)
			}
		}
	}
	if produce := serviceRunning(t, p, "produce"); !slices.Contains(produce.Profiles, "produce") {
		t.Errorf("the produce service is not under the profile produce: %v", produce.Profiles)
	}
	for _, name := range []string{"prometheus", "grafana"} {
		if s, ok := p.Services[name]; !ok || !slices.Contains(s.Profiles, "observability") {
			t.Errorf("service %s missing or not under the profile observability", name)
		}
	}
}

func TestCompose_DependenciesAreHealthyOrDone(t *testing.T) {
	p := loadCompose(t)
	for name, s := range p.Services {
		for dep, d := range s.DependsOn {
			ds, ok := p.Services[dep]
			if !ok {
				t.Errorf("%s depends on missing service %s", name, dep)
				continue
			}
			switch d.Condition {
			case types.ServiceConditionHealthy:
				if ds.HealthCheck == nil || ds.HealthCheck.Disable || len(ds.HealthCheck.Test) == 0 {
					t.Errorf("%s waits for %s to be healthy, but %s has no healthcheck", name, dep, dep)
				}
			case types.ServiceConditionCompletedSuccessfully:
				if ds.Restart != "" && ds.Restart != types.RestartPolicyNo {
					t.Errorf("%s waits for %s to complete, but %s restarts (%s)", name, dep, dep, ds.Restart)
				}
			}
		}
	}
	serve := serviceRunning(t, p, "serve")
	migrate := serviceRunning(t, p, "migrate")
	if c := serve.DependsOn[migrate.Name].Condition; c != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("serve depends on %s with %q, want service_completed_successfully", migrate.Name, c)
	}
	init := topicInitService(t, p)
	if c := serve.DependsOn[init.Name].Condition; c != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("serve depends on %s with %q, want service_completed_successfully", init.Name, c)
	}
	if _, ok := serve.DependsOn[serviceRunning(t, p, "fakepsp").Name]; !ok {
		t.Errorf("serve does not depend on the fake provider")
	}
	db := p.Services["postgres"]
	if c := migrate.DependsOn["postgres"].Condition; c != types.ServiceConditionHealthy {
		t.Errorf("migrate depends on postgres with %q, want service_healthy", c)
	}
	if db.HealthCheck == nil || len(db.HealthCheck.Test) == 0 {
		t.Errorf("postgres has no healthcheck")
	}
	// serve drains for DRAIN_TIMEOUT after SIGTERM; compose must wait longer.
	drain := durationVar(t, environment(serve), "DRAIN_TIMEOUT")
	if serve.StopGracePeriod == nil || time.Duration(*serve.StopGracePeriod) <= drain {
		t.Errorf("serve's stop_grace_period %v does not exceed DRAIN_TIMEOUT %s", serve.StopGracePeriod, drain)
	}
}

// durationVar returns a duration variable of env, or config.Serve's default.
func durationVar(t *testing.T, env map[string]string, name string) time.Duration {
	t.Helper()
	v, ok := env[name]
	if !ok || v == "" {
		v = serveDefault(t, name)
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// serveDefault returns the envDefault of a variable of config.Serve.
func serveDefault(t *testing.T, name string) string {
	t.Helper()
	var found string
	var walk func(rt reflect.Type)
	walk = func(rt reflect.Type) {
		for i := range rt.NumField() {
			f := rt.Field(i)
			tag := f.Tag.Get("env")
			if f.Type.Kind() == reflect.Struct && tag == "" {
				walk(f.Type)
				continue
			}
			if n, _, _ := strings.Cut(tag, ","); n == name {
				found = f.Tag.Get("envDefault")
			}
		}
	}
	walk(reflect.TypeFor[config.Serve]())
	if found == "" {
		t.Fatalf("config.Serve has no default for %s", name)
	}
	return found
}

// serveVar returns a variable of env, or config.Serve's default.
func serveVar(t *testing.T, env map[string]string, name string) string {
	t.Helper()
	if v := env[name]; v != "" {
		return v
	}
	return serveDefault(t, name)
}

// topicInitService returns the one-shot service that creates the topics.
func topicInitService(t *testing.T, p *types.Project) types.ServiceConfig {
	t.Helper()
	for _, s := range p.Services {
		if strings.Contains(strings.Join(append(slices.Clone([]string(s.Entrypoint)), s.Command...), " "), "kafka-topics.sh") {
			return s
		}
	}
	t.Fatalf("no service creates the topics with kafka-topics.sh")
	return types.ServiceConfig{}
}

var topicFlag = regexp.MustCompile(`--topic\s+(\S+)`)

// createdTopics parses the kafka-topics.sh --create lines of the init
// service: topic → its --config settings.
func createdTopics(t *testing.T, s types.ServiceConfig) map[string]map[string]string {
	t.Helper()
	script := strings.ReplaceAll(strings.Join(s.Command, "\n"), "\\\n", " ")
	topics := map[string]map[string]string{}
	for _, line := range strings.Split(script, "\n") {
		if !strings.Contains(line, "kafka-topics.sh") || !strings.Contains(line, "--create") {
			continue
		}
		m := topicFlag.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("cannot find --topic in %q", line)
		}
		cfg := map[string]string{}
		fields := strings.Fields(line)
		for i, f := range fields {
			if f == "--config" && i+1 < len(fields) {
				k, v, _ := strings.Cut(fields[i+1], "=")
				cfg[k] = v
			}
		}
		topics[m[1]] = cfg
	}
	return topics
}

func TestCompose_TopicsMatchBillingsSettings(t *testing.T) {
	p := loadCompose(t)
	serve := environment(serviceRunning(t, p, "serve"))
	topic, dlq := serveVar(t, serve, "KAFKA_TOPIC"), serveVar(t, serve, "KAFKA_DLQ_TOPIC")
	outcome := serveVar(t, serve, "KAFKA_OUTCOME_TOPIC")
	init := topicInitService(t, p)
	if len(init.Profiles) > 0 {
		t.Errorf("%s is under profiles %v; the topics must exist on a plain `docker compose up`", init.Name, init.Profiles)
	}
	topics := createdTopics(t, init)
	for _, name := range []string{topic, dlq, outcome} {
		if _, ok := topics[name]; !ok {
			t.Errorf("%s does not create topic %s (creates %v)", init.Name, name, sortedKeys(topics))
		}
	}
	if produce := environment(serviceRunning(t, p, "produce")); serveVar(t, produce, "KAFKA_TOPIC") != topic {
		t.Errorf("produce publishes to %s, serve consumes %s", serveVar(t, produce, "KAFKA_TOPIC"), topic)
	}
	// Kafka's default max.message.bytes is 1048588.
	size := func(name string) int {
		v, ok := topics[name]["max.message.bytes"]
		if !ok {
			return 1048588
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("topic %s: max.message.bytes=%q", name, v)
		}
		return n
	}
	if size(dlq) < size(topic) {
		t.Errorf("the DLQ accepts %d bytes, less than the topic's %d: a large invalid message could not be parked", size(dlq), size(topic))
	}
	// serve refuses to start when the topic keeps messages longer than
	// DEDUP_RETENTION remembers them.
	retention := durationVar(t, serve, "DEDUP_RETENTION")
	ms, ok := topics[topic]["retention.ms"]
	if !ok {
		ms = "604800000" // Kafka's default, 7 days
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 || time.Duration(n)*time.Millisecond > retention {
		t.Errorf("topic %s keeps messages %sms, longer than DEDUP_RETENTION %s: serve would refuse to start", topic, ms, retention)
	}
}

func TestCompose_ServiceAddressesAgree(t *testing.T) {
	p := loadCompose(t)
	serve := environment(serviceRunning(t, p, "serve"))

	// KAFKA_BROKERS names the kafka service's internal listener.
	for _, b := range strings.Split(serveVar(t, serve, "KAFKA_BROKERS"), ",") {
		host, port, err := net.SplitHostPort(b)
		if err != nil {
			t.Fatalf("KAFKA_BROKERS %q: %v", b, err)
		}
		k, ok := p.Services[host]
		if !ok {
			t.Errorf("KAFKA_BROKERS names %s, not a service", host)
			continue
		}
		if adv := environment(k)["KAFKA_ADVERTISED_LISTENERS"]; !strings.Contains(adv, "//"+host+":"+port) {
			t.Errorf("KAFKA_BROKERS %s is not among %s's advertised listeners %q", b, host, adv)
		}
	}

	// DATABASE_URL names the postgres service with its user, password and database.
	u, err := url.Parse(serve["DATABASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	pg, ok := p.Services[u.Hostname()]
	if !ok {
		t.Fatalf("DATABASE_URL names %s, not a service", u.Hostname())
	}
	pgEnv := environment(pg)
	pw, _ := u.User.Password()
	if u.User.Username() != pgEnv["POSTGRES_USER"] || pw != pgEnv["POSTGRES_PASSWORD"] || strings.TrimPrefix(u.Path, "/") != pgEnv["POSTGRES_DB"] {
		t.Errorf("DATABASE_URL does not match the postgres service's POSTGRES_USER/PASSWORD/DB")
	}
	if migrate := environment(serviceRunning(t, p, "migrate")); migrate["DATABASE_URL"] != serve["DATABASE_URL"] {
		t.Errorf("migrate and serve use different databases")
	}

	// PAYMENT_BASE_URL names the fakepsp service on the port of its --addr,
	// and both share the API key.
	psp := serviceRunning(t, p, "fakepsp")
	pu, err := url.Parse(serve["PAYMENT_BASE_URL"])
	if err != nil {
		t.Fatal(err)
	}
	if pu.Hostname() != psp.Name {
		t.Errorf("PAYMENT_BASE_URL names %s, the fake provider is %s", pu.Hostname(), psp.Name)
	}
	addr := flagValue(psp.Command, "addr")
	if pu.Port() == "" || !strings.HasSuffix(addr, ":"+pu.Port()) || strings.HasPrefix(addr, "127.0.0.1") || strings.HasPrefix(addr, "localhost") {
		t.Errorf("fakepsp listens on %q, PAYMENT_BASE_URL is %s: it must listen on all interfaces on that port", addr, pu)
	}
	if environment(psp)["PAYMENT_API_KEY"] != serve["PAYMENT_API_KEY"] {
		t.Errorf("fakepsp and serve have different PAYMENT_API_KEYs")
	}

	// The fake speaks serve's provider, and posts its webhooks to serve's
	// WEBHOOK_ADDR, on serve's path, signed with the secret serve verifies.
	provider := serveVar(t, serve, "PAYMENT_PROVIDER")
	if profile := cmp.Or(flagValue(psp.Command, "profile"), "contract"); profile != provider {
		t.Errorf("fakepsp speaks --profile %s, serve PAYMENT_PROVIDER=%s", profile, provider)
	}
	if hook := flagValue(psp.Command, "webhook-url"); hook != "" {
		hu, err := url.Parse(hook)
		if err != nil {
			t.Fatal(err)
		}
		webhookPort, err := port(serveVar(t, serve, "WEBHOOK_ADDR"))
		if err != nil {
			t.Fatal(err)
		}
		if want := serviceRunning(t, p, "serve").Name; hu.Hostname() != want || hu.Port() != strconv.Itoa(webhookPort) || hu.Path != "/webhooks/"+provider {
			t.Errorf("fakepsp posts its webhooks to %s, serve listens at http://%s:%d/webhooks/%s", hook, want, webhookPort, provider)
		}
		if s := environment(psp)["PAYMENT_WEBHOOK_SECRET"]; s == "" || s != serve["PAYMENT_WEBHOOK_SECRET"] {
			t.Errorf("fakepsp signs its webhooks with another PAYMENT_WEBHOOK_SECRET than serve verifies")
		}
	}

	// serve's HTTP_ADDR port is published and scraped.
	httpPort, err := port(serveVar(t, serve, "HTTP_ADDR"))
	if err != nil {
		t.Fatal(err)
	}
	published := false
	for _, pc := range serviceRunning(t, p, "serve").Ports {
		published = published || int(pc.Target) == httpPort
	}
	if !published {
		t.Errorf("serve's HTTP_ADDR port %d is not published", httpPort)
	}
	var prom struct {
		RuleFiles     []string `json:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			MetricsPath   string `json:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	promService := p.Services["prometheus"]
	readMounted(t, promService, "/etc/prometheus/prometheus.yml", &prom)
	want := serviceRunning(t, p, "serve").Name + ":" + strconv.Itoa(httpPort)
	scraped := false
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			if slices.Contains(st.Targets, want) && (sc.MetricsPath == "" || sc.MetricsPath == "/metrics") {
				scraped = true
				if sc.JobName != "billing" {
					t.Errorf("Prometheus scrapes billing as job %q; the alerts and dashboard expect job billing", sc.JobName)
				}
			}
		}
	}
	if !scraped {
		t.Errorf("Prometheus does not scrape %s/metrics", want)
	}
	for _, rf := range prom.RuleFiles {
		if mountSource(promService, rf) == "" {
			t.Errorf("Prometheus rule file %s is not mounted", rf)
		}
	}
}

// flagValue returns the value of --name in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		a = strings.TrimLeft(a, "-")
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// mountSource returns the host path bind-mounted at target in s, or "".
func mountSource(s types.ServiceConfig, target string) string {
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeBind && v.Target == target {
			return v.Source
		}
	}
	return ""
}

// readMounted decodes the YAML file bind-mounted at target in s.
func readMounted(t *testing.T, s types.ServiceConfig, target string, into any) {
	t.Helper()
	src := mountSource(s, target)
	if src == "" {
		t.Fatalf("service %s mounts nothing at %s", s.Name, target)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
}

func TestCompose_BindMountsExistAndGrafanaGetsTheDashboard(t *testing.T) {
	p := loadCompose(t)
	for name, s := range p.Services {
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeBind && !exists(v.Source) {
				t.Errorf("service %s mounts %s, which does not exist", name, v.Source)
			}
		}
	}
	grafana := p.Services["grafana"]
	dashboard, err := filepath.Abs(path(dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, v := range grafana.Volumes {
		found = found || v.Source == dashboard
	}
	if !found {
		t.Errorf("grafana does not mount %s, the dashboard Kubernetes ships", dashboardFile)
	}
	var ds struct {
		Datasources []struct {
			Type string `json:"type"`
			URL  string `json:"url"`
		} `json:"datasources"`
	}
	readMountedUnder(t, grafana, "/etc/grafana/provisioning", "datasources/prometheus.yml", &ds)
	if len(ds.Datasources) == 0 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("grafana has no Prometheus datasource: %+v", ds)
	}
	u, err := url.Parse(ds.Datasources[0].URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := p.Services[u.Hostname()]; !ok {
		t.Errorf("the datasource points at %s, not a service", u.Hostname())
	}
}

// readMountedUnder decodes file rel inside the directory bind-mounted at
// target in s.
func readMountedUnder(t *testing.T, s types.ServiceConfig, target, rel string, into any) {
	t.Helper()
	src := mountSource(s, target)
	if src == "" {
		t.Fatalf("service %s mounts nothing at %s", s.Name, target)
	}
	b, err := os.ReadFile(filepath.Join(src, rel))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

func TestCompose_AlertsEqualThePrometheusRule(t *testing.T) {
	var file, rule struct {
		Groups any `json:"groups"`
	}
	readYAML(t, path("deploy", "compose", "prometheus", "alerts.yml"), &file)
	var pr struct {
		Spec *struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	readYAML(t, path("deploy", "base", "prometheusrule.yaml"), &pr)
	if pr.Spec == nil {
		t.Fatal("prometheusrule.yaml has no spec")
	}
	rule.Groups = pr.Spec.Groups
	if !reflect.DeepEqual(file.Groups, rule.Groups) {
		t.Errorf("deploy/compose/prometheus/alerts.yml differs from deploy/base/prometheusrule.yaml's spec.groups; copy them over")
	}
}

func readYAML(t *testing.T, p string, into any) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatalf("%s: %v", p, err)
	}
}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}
