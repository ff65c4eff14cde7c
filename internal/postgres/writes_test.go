package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"example.com/billing/internal/postgres"
)

func TestRefuses(t *testing.T) {
	t.Parallel()
	pqErr := func(code string) error {
		return fmt.Errorf("settle: %w", &pq.Error{Code: pqerror.Code(code), Message: "m"})
	}
	tests := []struct {
		name    string
		err     error
		refuses bool
		state   string
	}{
		{"DiskFull", pqErr("53100"), true, "53100"},
		{"OutOfMemory", pqErr("53200"), true, "53200"},
		{"TooManyConnections", pqErr("53300"), true, "53300"},
		{"IOError", pqErr("58030"), true, "58030"},
		{"ReadOnly", pqErr("25006"), true, "25006"},
		{"DataCorrupted", pqErr("XX001"), true, "XX001"},
		// Races and the event's own faults are not the server refusing.
		{"UniqueRace", pqErr("23505"), false, "23505"},
		{"SerializationFailure", pqErr("40001"), false, "40001"},
		{"AdminShutdown", pqErr("57P01"), false, "57P01"},
		{"NoAnswer", errors.New("read tcp: connection timed out"), false, "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := postgres.Refuses(tt.err); got != tt.refuses {
				t.Errorf("Refuses = %v, want %v", got, tt.refuses)
			}
			if got := postgres.SQLState(tt.err); got != tt.state {
				t.Errorf("SQLState = %q, want %q", got, tt.state)
			}
		})
	}
}

// Writes reports a refusal until a write is committed; failures that are
// not the server refusing leave it as it was.
func TestWrites(t *testing.T) {
	t.Parallel()
	var w postgres.Writes
	if err := w.Err(); err != nil {
		t.Fatalf("a new Writes: %v, want nil", err)
	}
	w.Observe(&pq.Error{Code: "53100", Message: `could not extend file "base/1/2": No space left on device`})
	w.Observe(errors.New("connection reset by peer")) // the server went away meanwhile
	if err := w.Err(); err == nil || !strings.Contains(err.Error(), "No space left on device (SQLSTATE 53100)") {
		t.Errorf("after a full disk: %v", err)
	}
	w.Observe(nil)
	if err := w.Err(); err != nil {
		t.Errorf("after a committed write: %v, want nil", err)
	}
}
