package postgres

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lib/pq"
)

// Writes remembers whether the database refuses billing's writes for a
// reason of its own: a full disk, no memory, too many connections, an I/O
// error. Such a server answers queries, is not in recovery and its
// sessions are not read-only, so nothing else in /readyz notices it while
// every transaction fails; it is known only from the transactions
// themselves. A zero Writes is ready to use.
type Writes struct {
	mu     sync.Mutex
	failed error     // the last refusal, nil after a committed write
	at     time.Time // when it happened
}

// refusalMemory is how long a refusal counts without a new one: the
// failing writes are retried every few seconds, and a database that
// recovered while nothing was written must not stay unready.
const refusalMemory = 30 * time.Second

// Observe records the outcome of a write transaction.
func (w *Writes) Observe(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case err == nil:
		w.failed = nil
	case Refuses(err):
		w.failed, w.at = err, time.Now()
	}
}

// Err returns why the database refused the last write, nil when it took it
// or when no write was refused for a while.
func (w *Writes) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed == nil || time.Since(w.at) > refusalMemory {
		return nil
	}
	var pe *pq.Error
	errors.As(w.failed, &pe)
	return fmt.Errorf("refused by the server: %s (SQLSTATE %s)", pe.Message, pe.Code)
}

// Refuses reports whether err is the server refusing work for want of a
// resource or because of a fault of its own (SQLSTATE classes 53
// insufficient resources, 58 system error, XX internal error, and 25006
// read-only transaction): an outage of the database, retried like one,
// never a fault of the event.
func Refuses(err error) bool {
	var pe *pq.Error
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code.Class() {
	case "53", "58", "XX":
		return true
	}
	return pe.Code == "25006"
}

// SQLState returns the SQLSTATE of err, "none" when the server did not
// answer with one (the connection failed, a context ended).
func SQLState(err error) string {
	var pe *pq.Error
	if errors.As(err, &pe) {
		return string(pe.Code)
	}
	return "none"
}
