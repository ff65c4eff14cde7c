//go:build dev

package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

// progress shows one status line: rewritten in place on a terminal,
// printed once a second otherwise.
type progress struct {
	w        io.Writer
	terminal bool
	last     time.Time
	shown    string
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, terminal: isTerminal(w)}
}

func (p *progress) show(line string) {
	p.shown = line
	if p.terminal {
		fmt.Fprintf(p.w, "\r%-78s", line)
		return
	}
	if time.Since(p.last) >= time.Second {
		fmt.Fprintln(p.w, line)
		p.last = time.Now()
	}
}

// done ends the status line, showing its last state.
func (p *progress) done() {
	if p.terminal {
		fmt.Fprintln(p.w)
	} else if p.shown != "" {
		fmt.Fprintln(p.w, p.shown)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
