package check

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

var (
	binaryOnce sync.Once
	binary     *Binary
	binaryErr  error
)

// bin returns the facts about billing, read once per test binary.
func bin(t *testing.T) *Binary {
	t.Helper()
	binaryOnce.Do(func() { binary, binaryErr = LoadBinary() })
	if binaryErr != nil {
		t.Fatalf("read billing's source: %v", binaryErr)
	}
	return binary
}

// contractCommands is DESIGN.md's list of subcommands.
var contractCommands = []string{"serve", "migrate", "produce", "fakepsp", "devkafka", "demo", "maintain", "reconcile", "dlq"}

// anyFile is an existing file, for configuration that names a file that
// exists only where billing is deployed.
func anyFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mounted.pem")
	if err := os.WriteFile(p, []byte("placeholder"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// requireCommand fails unless args run a real billing subcommand with
// flags it defines, and one of the build that ships unless developerBuild
// (the image of the Dockerfile's target dev runs).
func requireCommand(t *testing.T, where string, args []string, developerBuild bool) string {
	t.Helper()
	b := bin(t)
	if len(args) == 0 {
		t.Errorf("%s: no billing command (the image's CMD would be used)", where)
		return ""
	}
	cmd := args[0]
	if !b.Commands[cmd] {
		t.Errorf("%s runs `billing %s`, which cmd/billing does not implement (it has: %s)", where, cmd, strings.Join(sortedKeys(b.Commands), ", "))
		return cmd
	}
	if !slices.Contains(contractCommands, cmd) {
		t.Errorf("%s runs `billing %s`, which is not in the contract's list of subcommands", where, cmd)
	}
	if b.Developer[cmd] && !developerBuild {
		t.Errorf("%s runs `billing %s`, a developer command, on the image that ships, which does not have it: run the developer build's image (the Dockerfile's target dev)", where, cmd)
	}
	flags := b.Flags[cmd]
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "-") {
			continue // a flag's value
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !flags[name] {
			t.Errorf("%s: `billing %s` has no flag -%s (it has: %s)", where, cmd, name, strings.Join(sortedKeys(flags), ", "))
		}
	}
	if len(args) > 1 && flags == nil {
		t.Errorf("%s: `billing %s` takes no arguments, got %v", where, cmd, args[1:])
	}
	return cmd
}

// requireVars fails for every variable of env that no billing command reads
// (or, for serve, that serve does not read).
func requireVars(t *testing.T, where, cmd string, names []string) {
	t.Helper()
	b := bin(t)
	for _, n := range names {
		if !b.Reads(cmd, n) {
			what := "billing"
			if cmd == "serve" {
				what = "billing serve"
			}
			t.Errorf("%s sets %s, which %s does not read", where, n, what)
		}
	}
}

// requireMetrics fails for every metric name expr selects that billing does
// not export; extra allows standard series from elsewhere (e.g. up, kube_*).
func requireMetrics(t *testing.T, where, expr string, extra func(string) bool) []string {
	t.Helper()
	names := MetricNames(expr)
	if len(names) == 0 {
		t.Errorf("%s: no metric in %q", where, expr)
	}
	for _, n := range names {
		if !bin(t).Metrics[n] && (extra == nil || !extra(n)) {
			t.Errorf("%s uses %s, which billing does not export (expr %q)", where, n, expr)
		}
	}
	return names
}

func TestBinary_FactsAreFound(t *testing.T) {
	b := bin(t)
	for _, c := range []string{"serve", "migrate", "fakepsp"} {
		if !b.Commands[c] {
			t.Errorf("command %s not found in cmd/billing's tables of subcommands", c)
		}
	}
	if b.Developer["serve"] || !b.Developer["fakepsp"] || !b.Developer["demo"] {
		t.Errorf("the developer build's commands are %v: want fakepsp and demo, not serve", sortedKeys(b.Developer))
	}
	for _, v := range []string{"KAFKA_BROKERS", "DATABASE_URL", "PAYMENT_BASE_URL", "HTTP_ADDR", "DRAIN_TIMEOUT", "DEDUP_RETENTION"} {
		if !b.ServeVars[v] {
			t.Errorf("config.Serve does not read %s", v)
		}
	}
	for _, m := range []string{"billing_events_total", "billing_consumer_lag", "billing_event_processing_seconds_bucket", "go_goroutines", "go_sql_in_use_connections"} {
		if !b.Metrics[m] {
			t.Errorf("metric %s not found among %v", m, sortedKeys(b.Metrics))
		}
	}
}

func TestMetricNames(t *testing.T) {
	cases := map[string][]string{
		`sum by (namespace) (billing_consumer_lag) > 1000`:                                              {"billing_consumer_lag"},
		`histogram_quantile(0.99, sum by (le) (rate(x_bucket{a="b",c=~"$ns"}[$__rate_interval])))`:      {"x_bucket"},
		`absent(up{job="billing"} == 1)`:                                                                {"up"},
		`time() - kube_cronjob_status_last_successful_time{cronjob="billing-maintain"} > 3 * 3600`:      {"kube_cronjob_status_last_successful_time"},
		`a / ignoring(x) group_left(y) b unless on(z) c offset 5m > 1e3`:                                {"a", "b", "c"},
		`sum without (pod)(rate(billing_events_total{outcome!~"charged|declined"}[10m])) and bool d`:    {"billing_events_total", "d"},
		`max by (instance) (process_resident_memory_bytes{job="billing",namespace=~"$namespace"}) or e`: {"process_resident_memory_bytes", "e"},
	}
	for expr, want := range cases {
		if got := MetricNames(expr); !slices.Equal(got, want) {
			t.Errorf("MetricNames(%q) = %v, want %v", expr, got, want)
		}
	}
}
