//go:build !linux

package pgserver

import "syscall"

// sysProcAttr runs a PostgreSQL program as cred (nil: as this process's
// user). Outside Linux there is no death signal: a killed process leaves
// its server running until it is stopped by hand.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
