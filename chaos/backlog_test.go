//go:build chaos

package chaos_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"example.com/billing/internal/postgres"
)

// A backlog of days (issue 29): after an outage, or a replay of events
// parked days ago, billing works through events 1 to 6 days old while its
// upkeep goes on beside it: serve's partition maintenance, and billing
// maintain run over and over. The backlog's days of processed_event have
// no partition (a database restored without them), so that writers and
// maintainers create the same days at once; the outbox keeps a day
// (OUTBOX_RETENTION=24h), so that the outcomes of these events belong to
// days retention dropped, or drops meanwhile.

// backlogEnv is serve's environment in the backlog scenario.
var backlogEnv = map[string]string{
	"OUTBOX_RETENTION":               "24h",
	"PARTITION_MAINTENANCE_INTERVAL": "1m",
}

// maintainLoop runs billing maintain one run after another until stopped,
// as a CronJob scheduled every few seconds would, and adds up what their
// reports say they did.
type maintainLoop struct {
	stop chan struct{}
	done chan struct{}

	mu               sync.Mutex
	runs             int
	created, dropped int // partitions, both tables
	kept, pruned     int
	failures         []string
	// ran lists every run that reported, when it ran and which tables it
	// left to another maintainer; failedRuns the runs that failed.
	ran, failedRuns []maintainRun
}

// maintainRun is one billing maintain process.
type maintainRun struct {
	pid        int
	began, end time.Time
	// heldBy are the maintainers (host/pid/random) whose lease made this
	// run skip a table.
	heldBy []string
}

// startMaintainLoop starts billing maintain over and over against the
// run's database, with the scenario's settings, logging to name.log.
func (r *run) startMaintainLoop(name string) *maintainLoop {
	l := &maintainLoop{stop: make(chan struct{}), done: make(chan struct{})}
	env := map[string]string{"DATABASE_URL": r.dsn, "LOG_LEVEL": "info"}
	for k, v := range r.sc.env {
		env[k] = v
	}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			var out bytes.Buffer
			// A scenario's retention may be shorter than the default
			// (the backlog's outbox keeps a day): maintain then says why.
			p, err := startProc(name, filepath.Join(r.dir, name+".log"), env, &out, "maintain",
				"--reason", "chaos: maintain run over and over", "--by", "chaos")
			if err != nil {
				l.fail(err.Error())
				return
			}
			<-p.done
			l.add(p, out.Bytes())
			time.Sleep(200 * time.Millisecond)
		}
	}()
	return l
}

func (l *maintainLoop) fail(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failures = append(l.failures, what)
}

// add counts one run: its exit and its report.
func (l *maintainLoop) add(p *proc, out []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs++
	if p.exitErr != nil {
		l.failures = append(l.failures, p.exitErr.Error())
		l.failedRuns = append(l.failedRuns, maintainRun{pid: p.pid(), began: p.started, end: p.exitedAt})
		return
	}
	var rep struct {
		Created, Dropped []string
		Skipped          bool
		HeldBy           string
		Outbox           struct {
			Created, Dropped, Kept []string
			Pruned                 int
			Skipped                bool
			HeldBy                 string
		}
	}
	// The report is the last line of stdout (the logs go to stderr).
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	if err := json.Unmarshal(lines[len(lines)-1], &rep); err != nil {
		l.failures = append(l.failures, fmt.Sprintf("report %q: %v", lines[len(lines)-1], err))
		return
	}
	l.created += len(rep.Created) + len(rep.Outbox.Created)
	l.dropped += len(rep.Dropped) + len(rep.Outbox.Dropped)
	l.kept += len(rep.Outbox.Kept)
	l.pruned += rep.Outbox.Pruned
	run := maintainRun{pid: p.pid(), began: p.started, end: p.exitedAt}
	if rep.Skipped {
		run.heldBy = append(run.heldBy, rep.HeldBy)
	}
	if rep.Outbox.Skipped {
		run.heldBy = append(run.heldBy, rep.Outbox.HeldBy)
	}
	l.ran = append(l.ran, run)
}

// finish stops the loop once its current run is over.
func (l *maintainLoop) finish() {
	close(l.stop)
	<-l.done
}

// dropBacklogDays readies the database once serve's start-up upkeep is
// done and before the first event is published: processed_event lacks the
// backlog's days, the outbox has them (a database that ran while they were
// today), so that writers and maintainers create the same days at once,
// and retention drops the expired outbox days while the outcomes of their
// events are recorded. Dropping a day once events flow would take the
// dedup records of those already settled in it.
func dropBacklogDays(r *run) error {
	db, err := postgres.Open(r.dsn, 1)
	if err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	defer db.Close()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	for d := 1; d <= 6; d++ {
		day := today.AddDate(0, 0, -d).Format(time.DateOnly)
		if _, err := db.Exec(`DROP TABLE IF EXISTS processed_event_p` + strings.ReplaceAll(day, "-", "")); err != nil {
			return fmt.Errorf("backlog: drop processed_event's %s: %w", day, err)
		}
		if _, err := db.Exec(`SELECT ensure_day_partition('outbox', $1::date)`, day); err != nil {
			return fmt.Errorf("backlog: the outbox's %s: %w", day, err)
		}
	}
	return nil
}

// The backlog: its days of processed_event dropped before the stream
// (dropBacklogDays), billing maintain running over and over, and one
// replica replaced mid-way with SIGTERM, as a rolling update does.
func injectBacklog(r *run) {
	r.fault("backlog", "processed_event's partitions of the 6 days before today dropped before the stream, the outbox's there")
	// The writers meet the missing days first, then maintain creates them
	// too, and drops the outbox's expired days.
	time.Sleep(2 * time.Second)
	r.fault("maintain", "billing maintain running over and over")
	r.maintaining = r.startMaintainLoop("maintain")
	rng := r.rng("backlog")
	r.sleepUntil(between(rng, r.stream.duration()/3, r.stream.duration()/2))
	r.sigterm(rng)
}

// checkBacklog checks what a backlog must not cost: a second provider
// request for any event, an outcome published twice, an error in any log.
func checkBacklog(r *run) {
	t := r.t
	l := r.maintaining
	if l == nil {
		t.Error("backlog: billing maintain never ran")
		return
	}
	l.finish()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.failures {
		t.Errorf("billing maintain: %s", f)
	}

	st, err := r.psp.stats()
	if err != nil {
		t.Errorf("provider stats: %v", err)
		return
	}
	if st.Requests != st.DistinctKeys || st.Replays != 0 {
		t.Errorf("the provider got %d requests for %d keys (%d replays): some event was asked more than once", st.Requests, st.DistinctKeys, st.Replays)
	}

	outcomes, err := r.readTopic(r.outcomeTopic)
	if err != nil {
		t.Errorf("read the outcome topic: %v", err)
		return
	}
	ids := map[string]bool{}
	for _, m := range outcomes {
		var o struct {
			EventID string `json:"eventId"`
		}
		if json.Unmarshal(m.Value, &o) == nil {
			ids[o.EventID] = true
		}
	}
	if len(ids) != len(outcomes) {
		t.Errorf("%d outcome events published for %d eventIds: some published twice", len(outcomes), len(ids))
	}

	var logs []string
	r.mu.Lock()
	for _, c := range r.all {
		logs = append(logs, c.logPath)
	}
	r.mu.Unlock()
	logs = append(logs, filepath.Join(r.dir, "maintain.log"))
	errorLines := 0
	for _, path := range logs {
		n, first := errorLinesOf(path)
		errorLines += n
		if n > 0 {
			t.Errorf("%s: %d ERROR lines, the first: %s", filepath.Base(path), n, first)
		}
	}
	healed := 0
	for _, ls := range r.logLines("a table has no partition for a row's day; creating it (is `billing maintain` running?)") {
		healed += len(ls)
	}
	r.figure("provider: %d requests for %d events (%d replays); %d outcome events published, %d eventIds; ERROR lines %d",
		st.Requests, st.DistinctKeys, st.Replays, len(outcomes), len(ids), errorLines)
	r.figure("%d maintain runs: %d partitions created, %d dropped, %d expired outbox days kept for a while, %d rows pruned from outbox_default; writers created missing days %d times",
		l.runs, l.created, l.dropped, l.kept, l.pruned, healed)
}

// errorLinesOf counts the lines logged at ERROR in the log at path, and
// returns the first.
func errorLinesOf(path string) (int, string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n, first := 0, ""
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"level":"ERROR"`) {
			if n == 0 {
				first = sc.Text()
			}
			n++
		}
	}
	return n, first
}
