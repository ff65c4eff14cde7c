//go:build chaos

package chaos_test

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// tmpfs is a small filesystem of the suite's own (mount -t tmpfs -o
// size=...), for a PostgreSQL data directory that fills up. Its source is
// named bchx<pid>, so that a killed suite's mount is found and unmounted by
// the next one (cleanStale).
type tmpfs struct {
	dir string
}

// tmpfsAvailable says why a tmpfs cannot be mounted here, nil when it can.
func tmpfsAvailable() error {
	if os.Geteuid() != 0 {
		return errors.New("a filesystem that fills up needs root (mount -t tmpfs)")
	}
	return nil
}

// mountTmpfs mounts a tmpfs of size bytes on dir (created), owned by uid.
func mountTmpfs(dir string, size int64, uid, gid int) (*tmpfs, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("size=%d,mode=0700,uid=%d,gid=%d", size, uid, gid)
	if err := command("mount", "-t", "tmpfs", "-o", opts, fmt.Sprintf("%s%d", netPrefix, os.Getpid()), dir); err != nil {
		return nil, err
	}
	return &tmpfs{dir: dir}, nil
}

// free returns the bytes still available on the filesystem.
func (f *tmpfs) free() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(f.dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// fill writes the file path on the filesystem until no space is left,
// and returns how many bytes it took.
func (f *tmpfs) fill(path string) (int64, error) {
	file, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for len(buf) > 0 {
		w, err := file.Write(buf)
		n += int64(w)
		switch {
		case errors.Is(err, syscall.ENOSPC):
			// The last bytes, in smaller writes: a tmpfs allocates pages.
			buf = buf[:len(buf)/2]
		case err != nil:
			return n, err
		}
	}
	return n, nil
}

// unmount unmounts the filesystem (lazily: a process that still has a file
// open there does not keep it).
func (f *tmpfs) unmount() error {
	return command("umount", "-l", f.dir)
}
