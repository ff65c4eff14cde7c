package check

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// dashboardFile is billing's Grafana dashboard, shipped by the base's
// configMapGenerator and mounted by docker-compose.yml.
const dashboardFile = "deploy/base/dashboards/billing.json"

// dashboardExprs returns every PromQL expression of the dashboard, by the
// title of its panel (or of the templating variable).
func dashboardExprs(t *testing.T) (map[string]any, map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(path(dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	exprs := map[string][]string{}
	var walk func(v any, title string)
	walk = func(v any, title string) {
		switch v := v.(type) {
		case map[string]any:
			if s, ok := v["title"].(string); ok {
				title = s
			}
			for k, c := range v {
				if s, ok := c.(string); ok && k == "expr" {
					exprs[title] = append(exprs[title], s)
				}
				walk(c, title)
			}
		case []any:
			for _, c := range v {
				walk(c, title)
			}
		}
	}
	walk(d, "")
	return d, exprs
}

func TestDashboard_UsesOnlyMetricsBillingExports(t *testing.T) {
	d, exprs := dashboardExprs(t)
	if d["uid"] == nil || d["title"] == nil {
		t.Errorf("dashboard lacks uid or title")
	}
	if len(exprs) == 0 {
		t.Fatal("dashboard has no queries")
	}
	used := map[string]bool{}
	for title, es := range exprs {
		for _, e := range es {
			// up is Prometheus' own series of each scraped target.
			for _, n := range requireMetrics(t, "dashboard panel "+title, e, func(n string) bool { return n == "up" }) {
				used[n] = true
			}
		}
	}
	// What the dashboard is for: events by outcome, lag per partition,
	// processing and payment latency, DLQ rate, retries.
	for _, m := range []string{
		"billing_events_total", "billing_consumer_lag", "billing_event_processing_seconds_bucket",
		"billing_payment_request_seconds_bucket", "billing_dlq_messages_total", "billing_retries_total",
	} {
		if !used[m] {
			t.Errorf("the dashboard has no panel on %s", m)
		}
	}
	// Queries name the datasource through a variable, so that the same JSON
	// works with compose's provisioned Prometheus and a cluster's.
	b, _ := os.ReadFile(path(dashboardFile))
	if !strings.Contains(string(b), `"uid": "${datasource}"`) {
		t.Errorf("panels do not use the ${datasource} variable")
	}
}
