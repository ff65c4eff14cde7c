package check

import (
	"maps"
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CloudNativePG's Pooler (postgresql.cnpg.io/v1), whose Go types would
// bring the operator's module into this one's. The struct holds the
// fields of the CRD's schema that deploy/cnpg can use, so that the strict
// decode of decodeStrict fails on a misspelt or misplaced field as the API
// server's schema validation would; what the schema or the operator's
// admission webhook restricts is checked below.
type cnpgPooler struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Cluster struct {
			Name string `json:"name"`
		} `json:"cluster"`
		Type      string `json:"type,omitempty"` // rw (the default), ro, r
		Instances *int32 `json:"instances,omitempty"`
		Template  *struct {
			Metadata metav1.ObjectMeta `json:"metadata,omitempty"`
			Spec     corev1.PodSpec    `json:"spec,omitempty"`
		} `json:"template,omitempty"`
		PgBouncer struct {
			PoolMode   string            `json:"poolMode,omitempty"` // session (the default) or transaction
			Parameters map[string]string `json:"parameters,omitempty"`
			PgHBA      []string          `json:"pg_hba,omitempty"`
			Paused     *bool             `json:"paused,omitempty"`
		} `json:"pgbouncer"`
	} `json:"spec"`
}

// cnpgPoolerParameters are the PgBouncer parameters CloudNativePG's
// admission webhook lets a Pooler set (AllowedPgbouncerGenericConfigurationParameters,
// those of every release since 1.16); it refuses any other.
var cnpgPoolerParameters = []string{
	"application_name_add_host", "autodb_idle_timeout", "client_idle_timeout", "client_login_timeout",
	"default_pool_size", "disable_pqexec", "idle_transaction_timeout", "ignore_startup_parameters",
	"log_connections", "log_disconnections", "log_pooler_errors", "log_stats", "max_client_conn",
	"max_db_connections", "max_user_connections", "min_pool_size", "query_timeout", "query_wait_timeout",
	"reserve_pool_size", "reserve_pool_timeout", "server_check_delay", "server_check_query",
	"server_connect_timeout", "server_fast_close", "server_idle_timeout", "server_lifetime",
	"server_login_retry", "server_reset_query", "server_reset_query_always", "server_round_robin",
	"stats_period", "verbose",
}

const cnpgDir = "deploy/cnpg"

// The Pooler fronts the primary in transaction mode with more than one
// PgBouncer, sets only parameters the operator accepts, and is sized for
// the base: each instance takes every client of the replicas and of one
// more during a rollout (the Service may send them all to one instance),
// with room for billing maintain and billing reconcile, and lends every
// writer of every replica a server session at once.
func TestCNPG_PoolerIsSizedForTheBase(t *testing.T) {
	r := build(t, cnpgDir)
	var poolers []*cnpgPooler
	for _, o := range r.objects {
		p, ok := o.(*cnpgPooler)
		if !ok {
			t.Errorf("%s renders a %T: only Poolers belong there", cnpgDir, o)
			continue
		}
		poolers = append(poolers, p)
	}
	if len(poolers) != 1 {
		t.Fatalf("%s renders %d Poolers, want 1", cnpgDir, len(poolers))
	}
	p := poolers[0]
	if p.Spec.Cluster.Name == "" || p.Spec.Cluster.Name == p.Name {
		t.Errorf("Pooler %s: cluster %q; it must name the Cluster, and not share its name", p.Name, p.Spec.Cluster.Name)
	}
	if p.Spec.Type != "" && p.Spec.Type != "rw" {
		t.Errorf("Pooler %s: type %q; billing writes, so it needs the primary (rw)", p.Name, p.Spec.Type)
	}
	if p.Spec.PgBouncer.PoolMode != "transaction" {
		t.Errorf("Pooler %s: poolMode %q, want transaction (CloudNativePG's default is session)", p.Name, p.Spec.PgBouncer.PoolMode)
	}
	if p.Spec.Instances == nil || *p.Spec.Instances < 2 {
		t.Errorf("Pooler %s: fewer than 2 instances: one PgBouncer is a single point of failure", p.Name)
	}
	params := map[string]int{}
	for _, k := range slices.Sorted(maps.Keys(p.Spec.PgBouncer.Parameters)) {
		v := p.Spec.PgBouncer.Parameters[k]
		if !slices.Contains(cnpgPoolerParameters, k) {
			t.Errorf("Pooler %s sets %s, which CloudNativePG refuses (not among its PgBouncer parameters)", p.Name, k)
		}
		if n, err := strconv.Atoi(v); err == nil {
			params[k] = n
		}
	}

	base := build(t, baseDir)
	replicas := int(*base.serveDeployment(t).Spec.Replicas)
	conns, err := strconv.Atoi(base.configMaps["billing-config"].Data["DATABASE_MAX_CONNS"])
	if err != nil {
		t.Fatalf("billing-config's DATABASE_MAX_CONNS: %v", err)
	}
	// maintain and reconcile open 2 connections each.
	need := (replicas+1)*conns + 2*2
	if params["max_client_conn"] < need {
		t.Errorf("Pooler %s: max_client_conn %d, want at least (%d replicas + 1) x DATABASE_MAX_CONNS %d + 4 = %d", p.Name, params["max_client_conn"], replicas, conns, need)
	}
	// A server session for each writer of each replica (a quarter of its
	// connections claim, as many settle), and two for its position saves
	// and the relay: none of them waits in PgBouncer.
	writers := replicas * (conns/2 + 2)
	if pool := params["default_pool_size"]; pool < writers || pool > params["max_client_conn"] {
		t.Errorf("Pooler %s: default_pool_size %d, want at least %d replicas x (DATABASE_MAX_CONNS %d / 2 + 2) = %d, and at most max_client_conn (%d)",
			p.Name, pool, replicas, conns, writers, params["max_client_conn"])
	}
}
