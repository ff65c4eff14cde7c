package pgbouncer

import "syscall"

// sysProcAttr runs pgbouncer as cred (nil: as this process's user) and has
// the kernel kill it when this process dies, so that a test binary killed
// by its timeout leaves no pooler running.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
}
