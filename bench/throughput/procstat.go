package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// procTimes are the CPU times of one process, from /proc/<pid>/stat, in
// clock ticks: its own (utime, stime) and those of its children that
// exited and were waited for (cutime, cstime).
type procTimes struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

// parseProcStat reads a /proc/<pid>/stat line. The command name (field 2)
// is in parentheses and may itself hold spaces and parentheses, so the
// fields are counted from the last ')'.
func parseProcStat(line string) (procTimes, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return procTimes{}, errors.New("stat: no command name")
	}
	// After the name: state (field 3), ppid (4), ..., utime (14), stime
	// (15), cutime (16), cstime (17).
	f := strings.Fields(line[i+1:])
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("stat: %d fields after the command name, want at least 15", len(f))
	}
	var t procTimes
	var err error
	if t.ppid, err = strconv.Atoi(f[1]); err != nil {
		return procTimes{}, fmt.Errorf("stat: ppid: %w", err)
	}
	for j, p := range []*int64{&t.utime, &t.stime, &t.cutime, &t.cstime} {
		if *p, err = strconv.ParseInt(f[11+j], 10, 64); err != nil {
			return procTimes{}, fmt.Errorf("stat: field %d: %w", 14+j, err)
		}
	}
	return t, nil
}

// ticksPerSecond is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go builds for.
const ticksPerSecond = 100

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / ticksPerSecond }

func readProcStat(pid int) (procTimes, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTimes{}, err
	}
	return parseProcStat(string(b))
}

// cpuTime is the user+system CPU time of process pid so far.
func cpuTime(pid int) (time.Duration, error) {
	t, err := readProcStat(pid)
	if err != nil {
		return 0, err
	}
	return ticks(t.utime + t.stime), nil
}

// serverCPU is the CPU time a PostgreSQL server used so far: the
// postmaster's own, its live children's (backends, the checkpointer, the
// WAL writer...), and, through the postmaster's cutime and cstime, that of
// the children that exited (a backend whose connection closed). A child
// that exits between the two reads is counted at the next sample, in its
// parent's.
func serverCPU(postmaster int) (time.Duration, error) {
	pm, err := readProcStat(postmaster)
	if err != nil {
		return 0, fmt.Errorf("postmaster: %w", err)
	}
	total := pm.utime + pm.stime + pm.cutime + pm.cstime
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == postmaster {
			continue
		}
		t, err := readProcStat(pid)
		if err != nil || t.ppid != postmaster {
			continue // gone, or not the server's
		}
		total += t.utime + t.stime
	}
	return ticks(total), nil
}

// lsn is a WAL position: pg_lsn's text is its high and low 32 bits in
// hexadecimal, "16/B374D848".
type lsn uint64

func parseLSN(s string) (lsn, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("LSN %q: no '/'", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	return lsn(h<<32 | l), nil
}

func (l lsn) String() string { return fmt.Sprintf("%X/%X", uint64(l)>>32, uint32(l)) }

// relPath is a block reference's relation, as pg_walinspect writes it:
// tablespace/database/relfilenode, e.g. "1663/16384/16390".
type relPath struct {
	spc, db, node uint32
}

func parseRelPath(s string) (relPath, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return relPath{}, fmt.Errorf("relation %q: want tablespace/database/relfilenode", s)
	}
	var out [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return relPath{}, fmt.Errorf("relation %q: %w", s, err)
		}
		out[i] = uint32(n)
	}
	return relPath{spc: out[0], db: out[1], node: out[2]}, nil
}
