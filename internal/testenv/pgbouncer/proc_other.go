//go:build !linux

package pgbouncer

import "syscall"

// sysProcAttr runs pgbouncer as cred (nil: as this process's user).
// Outside Linux there is no death signal: a killed test binary leaves its
// pooler running until it is stopped by hand.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
