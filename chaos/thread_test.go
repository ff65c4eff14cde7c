//go:build chaos

package chaos_test

import (
	"os/exec"
	"runtime"
)

// startOnOwnThread starts cmd, whose SysProcAttr sets Pdeathsig, and calls
// wait with cmd.Wait's error once it exits. Linux sends the death signal
// when the *thread* that forked the child exits, not the process, and the
// Go runtime ends a thread when a goroutine locked to it returns (as
// apachekafka's node goroutines do when their broker dies). A postmaster
// forked on such a thread was SIGKILLed minutes later in the middle of an
// unrelated scenario. So the fork and the wait run on a thread locked to
// this goroutine, which no other goroutine uses, for the child's life.
func startOnOwnThread(cmd *exec.Cmd, wait func(error)) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		wait(cmd.Wait())
	}()
	return <-started
}
