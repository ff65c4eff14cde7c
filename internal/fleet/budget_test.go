package fleet_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"example.com/billing/internal/dev/fakepsp"
	"example.com/billing/internal/fleet"
	"example.com/billing/internal/metrics"
	"example.com/billing/internal/payment"
	"example.com/billing/internal/payment/contract"
	"example.com/billing/internal/testenv/dbtest"
)

// accountRPS is the provider account's limit in the budget's tests.
const accountRPS = 100

// arrivals notes when each charge request reached the provider.
type arrivals struct {
	mu sync.Mutex
	at []time.Time
}

func (a *arrivals) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			a.mu.Lock()
			a.at = append(a.at, time.Now())
			a.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (a *arrivals) snapshot() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at...)
}

// within counts the arrivals in (to-d, to].
func within(at []time.Time, to time.Time, d time.Duration) int {
	n := 0
	for _, a := range at {
		if a.After(to.Add(-d)) && !a.After(to) {
			n++
		}
	}
	return n
}

// peak is the most arrivals within any one second (a sliding window, as a
// provider's rate limit counts); at is in order.
func peak(at []time.Time) int {
	best, j := 0, 0
	for i := range at {
		for at[i].Sub(at[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// replica is one process's payment client and fleet member, with a backlog
// of charges that never ends: as many callers as it has slots, each
// charging one new key after another.
type replica struct {
	client *payment.Client
	member *fleet.Member
	m      *metrics.Metrics
	stop   context.CancelFunc
	done   sync.WaitGroup
}

// startReplica joins the fleet of group and starts its backlog.
func startReplica(t *testing.T, dsn, pspURL, group string) *replica {
	t.Helper()
	db := dbtest.Open(t, dsn, 4)
	r := &replica{m: metrics.New(prometheus.NewRegistry())}
	r.client = payment.New(contract.New(pspURL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 32, AccountShared: true}, r.m)
	t.Cleanup(r.client.Close)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.member = fleet.NewMember(db, fleet.Config{Group: group, Instance: uuid.Must(uuid.NewV4()), AccountMaxRPS: accountRPS}, r.client, r.m, log)
	if err := r.member.Join(dbtest.Context(t)); err != nil {
		t.Fatal(err)
	}
	r.member.Follow(r.client)
	ctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	r.done.Go(func() { r.member.Run(ctx) })
	for range 32 {
		r.done.Go(func() {
			for ctx.Err() == nil {
				req := payment.Request{IdempotencyKey: uuid.Must(uuid.NewV7()).String(), OrderID: 1, CustomerID: 1, Amount: 100, Currency: "EUR"}
				_, _ = r.client.Charge(ctx, req)
			}
		})
	}
	t.Cleanup(r.kill)
	return r
}

// kill stops the replica as kill -9 would: its requests and renewals stop,
// and it never gives its share back.
func (r *replica) kill() {
	r.stop()
	r.done.Wait()
}

// Three replicas with a backlog share one account's budget of 100
// requests a second: no second holds more than 100 requests at the
// provider, whose limit answers 429 past it, and the fleet sends at least
// 90 a second while the backlog lasts; one replica killed, the other two
// send 90 a second again within 10 s, once its share's lease expired.
func TestBudget_ThreeReplicasShareTheAccount(t *testing.T) {
	_, dsn := dbtest.New(t)
	psp := fakepsp.New(fakepsp.Options{Seed: 1, RateLimit: accountRPS, Latency: 20 * time.Millisecond})
	var arrived arrivals
	srv := httptest.NewServer(arrived.wrap(psp))
	t.Cleanup(srv.Close)

	const group = "billing-budget-test"
	a := startReplica(t, dsn, srv.URL, group)
	b := startReplica(t, dsn, srv.URL, group)
	c := startReplica(t, dsn, srv.URL, group)
	time.Sleep(8 * time.Second)
	killed := time.Now()
	c.kill()

	// The two survivors reach 90 a second again: measured over the last
	// second, every 100 ms.
	var respread time.Duration
	for deadline := killed.Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		now := time.Now()
		if now.Sub(killed) > time.Second && within(arrived.snapshot(), now, time.Second) >= 90 {
			respread = now.Sub(killed)
			break
		}
	}
	time.Sleep(2 * time.Second)
	a.kill()
	b.kill()

	at := arrived.snapshot()
	st := psp.Stats()
	first := at[0]
	var perSecond []int
	for to := first.Add(time.Second); !to.After(at[len(at)-1]); to = to.Add(time.Second) {
		perSecond = append(perSecond, within(at, to, time.Second))
	}
	mean := float64(within(at, killed, killed.Sub(first))) / killed.Sub(first).Seconds()
	t.Logf("budget %d/s, three replicas with a backlog: %d requests, busiest second %d (provider's count %d), 429s %d; mean %.1f/s over the %s before the kill; the two survivors at 90/s again %s after the kill; requests by second from the first: %v",
		accountRPS, len(at), peak(at), st.PeakPerSecond, st.RateLimited, mean, killed.Sub(first).Round(100*time.Millisecond), respread.Round(100*time.Millisecond), perSecond)
	if p := peak(at); p > accountRPS || st.PeakPerSecond > accountRPS {
		t.Errorf("busiest second: %d requests (provider: %d), over the account's %d", p, st.PeakPerSecond, accountRPS)
	}
	if st.RateLimited > 0 {
		t.Errorf("the provider answered 429 %d times", st.RateLimited)
	}
	if mean < 90 {
		t.Errorf("mean %.1f requests a second while three replicas had a backlog, want at least 90", mean)
	}
	if respread == 0 || respread > 10*time.Second {
		t.Errorf("after the kill, the survivors did not reach 90 a second within 10 s (%s)", respread)
	}
}

// A replica that cannot renew (its database gone) stops using its share
// at its lease's end, and the others take it over once its row expired.
func TestBudget_ALapsedShareSendsNothing(t *testing.T) {
	_, dsn := dbtest.New(t)
	psp := fakepsp.New(fakepsp.Options{Seed: 1})
	var arrived arrivals
	srv := httptest.NewServer(arrived.wrap(psp))
	t.Cleanup(srv.Close)

	db := dbtest.Open(t, dsn, 2)
	m := metrics.New(prometheus.NewRegistry())
	client := payment.New(contract.New(srv.URL, ""), payment.Config{Timeout: 5 * time.Second, MaxConcurrency: 4, AccountShared: true}, m)
	t.Cleanup(client.Close)
	ctx := dbtest.Context(t)
	if _, err := client.Charge(shortly(t, time.Second), payment.Request{IdempotencyKey: uuid.Must(uuid.NewV7()).String(), OrderID: 1, CustomerID: 1, Amount: 100, Currency: "EUR"}); err == nil {
		t.Fatal("a client of a shared budget charged before it had a share")
	}
	member := fleet.NewMember(db, fleet.Config{Group: "g", Instance: uuid.Must(uuid.NewV4()), AccountMaxRPS: accountRPS}, client, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := member.Join(ctx); err != nil {
		t.Fatal(err)
	}
	charge := func(ctx context.Context) error {
		_, err := client.Charge(ctx, payment.Request{IdempotencyKey: uuid.Must(uuid.NewV7()).String(), OrderID: 1, CustomerID: 1, Amount: 100, Currency: "EUR"})
		return err
	}
	if err := charge(ctx); err != nil {
		t.Fatalf("with its share: %v", err)
	}
	// No renewal: the lease lapses within fleet.LeaseTTL.
	time.Sleep(fleet.LeaseTTL)
	sent := len(arrived.snapshot())
	if err := charge(shortly(t, time.Second)); err == nil {
		t.Error("charged after the share's lease lapsed")
	}
	if n := len(arrived.snapshot()); n != sent {
		t.Errorf("%d requests reached the provider after the lease lapsed", n-sent)
	}

	// Another replica takes the whole budget once the row expired.
	other := startReplicaOn(t, dsn, srv.URL, "g")
	if got := other.share(); got != accountRPS {
		t.Errorf("the other replica's share = %v, want the whole %d", got, accountRPS)
	}
}

// shortly is a context that ends after d.
func shortly(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// lone is a member without a backlog, for its share.
type lone struct {
	m *metrics.Metrics
}

func (l lone) share() float64 { return testutil.ToFloat64(l.m.AccountShare) }

// startReplicaOn joins group's fleet without a backlog.
func startReplicaOn(t *testing.T, dsn, pspURL, group string) lone {
	t.Helper()
	db := dbtest.Open(t, dsn, 2)
	m := metrics.New(prometheus.NewRegistry())
	client := payment.New(contract.New(pspURL, ""), payment.Config{Timeout: 5 * time.Second, AccountShared: true}, m)
	t.Cleanup(client.Close)
	member := fleet.NewMember(db, fleet.Config{Group: group, Instance: uuid.Must(uuid.NewV4()), AccountMaxRPS: accountRPS}, client, m, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := member.Join(dbtest.Context(t)); err != nil {
		t.Fatal(err)
	}
	return lone{m: m}
}
