//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// setUserTimeout does nothing where TCP_USER_TIMEOUT does not exist: the
// keepalive settings still end a connection whose server vanished.
func setUserTimeout(syscall.RawConn, time.Duration) error { return nil }
