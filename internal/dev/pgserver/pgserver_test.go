package pgserver_test

import (
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	_ "github.com/lib/pq"

	"example.com/billing/internal/dev/pgserver"
)

// closedURL is a server URL at which nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable"
}

// deadPid is the pid of a process that has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestEnsure starts a cluster where nothing answers, from the binaries this
// run finds (local ones, or the embedded ones with PG_BIN set to an empty
// directory), then finds it answering.
func TestEnsure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL")
	}
	orphan := filepath.Join(os.TempDir(), fmt.Sprintf("billing-pg-%d-test", deadPid(t)))
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(orphan) })

	opts := pgserver.TestOptions(os.Getenv)
	opts.URL = closedURL(t)
	s, err := pgserver.Ensure(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
	})
	if s.Cluster == nil {
		t.Fatalf("nothing answers at %s, yet Ensure started no cluster: %s", opts.URL, s.Describe())
	}
	t.Log(s.Describe())
	if u, _ := url.Parse(opts.URL); !strings.Contains(s.Describe(), "nothing answered at "+u.Host) {
		t.Errorf("Describe() = %q, does not say where nothing answered", s.Describe())
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("the directory of a cluster whose process is gone is still there: %v", err)
	}

	db, err := sql.Open("postgres", s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version, dataDir string
	if err := db.QueryRowContext(t.Context(), `SELECT current_setting('server_version'), current_setting('data_directory')`).Scan(&version, &dataDir); err != nil {
		t.Fatal(err)
	}
	if want := s.Cluster.Binaries.Version; !strings.HasPrefix(want, strings.Fields(version)[0]) {
		t.Errorf("server_version %q, binaries %q", version, want)
	}
	// PostgreSQL refuses root: as root, the cluster belongs to another user.
	fi, err := os.Stat(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; os.Geteuid() == 0 && uid == 0 {
		t.Error("running as root, the cluster's data directory belongs to root")
	}

	again, err := pgserver.Ensure(t.Context(), pgserver.Options{URL: s.URL})
	if err != nil || again.Cluster != nil {
		t.Errorf("Ensure at the started cluster: %v, cluster %v: want the server that answers", err, again.Cluster)
	}

	db.Close()
	closed = true
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if pgserver.Answers(t.Context(), s.URL) {
		t.Error("the cluster still answers after Close")
	}
	if _, err := os.Stat(filepath.Dir(dataDir)); !os.IsNotExist(err) {
		t.Errorf("the cluster's directory is still there after Close: %v", err)
	}
}

// script writes an executable shell script.
func script(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestLocalBinaries(t *testing.T) {
	installed := func(t *testing.T, version string) string {
		dir := t.TempDir()
		script(t, filepath.Join(dir, "initdb"), "exit 1")
		script(t, filepath.Join(dir, "postgres"), "echo 'postgres (PostgreSQL) "+version+" (Debian "+version+"-1)'")
		return dir
	}
	t.Run("OK_PGBin", func(t *testing.T) {
		dir := installed(t, "16.4")
		b, err := pgserver.LocalBinaries(t.Context(), dir)
		if err != nil || b.Dir != dir || b.Version != "16.4" || b.Embedded {
			t.Errorf("LocalBinaries(%s) = %+v, %v", dir, b, err)
		}
	})
	t.Run("ErrTooOld", func(t *testing.T) {
		_, err := pgserver.LocalBinaries(t.Context(), installed(t, "13.2"))
		if !errors.Is(err, pgserver.ErrNoLocalBinaries) || !strings.Contains(err.Error(), "13.2, older than 15") {
			t.Errorf("PostgreSQL 13: %v", err)
		}
	})
	t.Run("ErrEmptyPGBinMeansNone", func(t *testing.T) {
		_, err := pgserver.LocalBinaries(t.Context(), t.TempDir())
		if !errors.Is(err, pgserver.ErrNoLocalBinaries) {
			t.Errorf("an empty PG_BIN: %v, want ErrNoLocalBinaries", err)
		}
	})
}

func TestAnswers(t *testing.T) {
	if pgserver.Answers(t.Context(), closedURL(t)) {
		t.Error("a closed port answers")
	}
	// Something that accepts and then speaks no PostgreSQL still answers:
	// it is the configured server, and the caller reports what is wrong.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	if !pgserver.Answers(t.Context(), "postgres://postgres@"+ln.Addr().String()+"/postgres?sslmode=disable") {
		t.Error("a listening server does not answer")
	}
}
