package fakepsp_test

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestMain fails the run when a goroutine of a fake provider outlives the
// tests: every test closes its servers, and Close must stop what they
// started (verdicts waiting, webhooks being sent).
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if stack := leftoverGoroutines(5 * time.Second); stack != nil {
			fmt.Fprintf(os.Stderr, "goroutines of fakepsp left after the tests:\n%s\n", stack)
			code = 1
		}
	}
	os.Exit(code)
}

// leftoverGoroutines returns the goroutine dump while a goroutine still
// runs the provider's code after wait, nil once none does.
func leftoverGoroutines(wait time.Duration) []byte {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		if !bytes.Contains(buf, []byte("billing/internal/dev/fakepsp.(*Server)")) {
			return nil
		}
		if time.Now().After(deadline) {
			return buf
		}
		time.Sleep(50 * time.Millisecond)
	}
}
