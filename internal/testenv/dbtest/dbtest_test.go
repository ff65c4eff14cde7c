package dbtest_test

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"example.com/billing/internal/dev/pgserver"
	"example.com/billing/internal/testenv/dbtest"
)

var (
	usesDbtest = regexp.MustCompile(`\bdbtest\.(New|Empty|ServerURL)\(`)
	stopsIt    = regexp.MustCompile(`func TestMain\(m \*testing\.M\) \{[^\n]*\bdbtest\.(Main|WithServer)\(m\)`)
)

// A test binary that starts a server must stop it, and only TestMain runs
// after its tests: where no server answers, the tests of a package without
// one fail (dbtest refuses to start a server nothing would stop). This
// finds such a package where a server does answer, as in CI.
func TestEveryPackageThatUsesDbtestStopsItsServer(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no module root at %s: %v", root, err)
	}
	uses := map[string]bool{}
	stops := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		uses[dir] = uses[dir] || usesDbtest.Match(b)
		stops[dir] = stops[dir] || stopsIt.Match(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !uses["internal/dedup"] || !stops["internal/dedup"] {
		t.Fatalf("the scan does not see internal/dedup's use of dbtest and its TestMain: uses %v, stops %v", uses["internal/dedup"], stops["internal/dedup"])
	}
	for dir, u := range uses {
		if u && !stops[dir] && dir != "internal/testenv/dbtest" {
			t.Errorf("%s uses dbtest without stopping the server its tests may start: add\n"+
				"  func TestMain(m *testing.M) { dbtest.Main(m) }\n"+
				"or, with kafkatest, kafkatest.Main(dbtest.WithServer(m))", dir)
		}
	}
}

// TestMain runs the tests under dbtest.Main, except in a helper process
// asked to run without it.
func TestMain(m *testing.M) {
	if os.Getenv("DBTEST_HELPER") == "without-main" {
		os.Exit(m.Run())
	}
	dbtest.Main(m)
}

// TestHelperProcess is the test binary of a package where no server
// answers (TestServer_NoneAnswers).
func TestHelperProcess(t *testing.T) {
	if os.Getenv("DBTEST_HELPER") == "" {
		t.Skip("a helper of TestServer_NoneAnswers")
	}
	db, _ := dbtest.New(t)
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM processed_event`); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("server %s\n", dbtest.ServerURL(t))
}

func TestServer_NoneAnswers(t *testing.T) {
	if testing.Short() || os.Getenv("DBTEST_HELPER") != "" {
		t.Skip("starts PostgreSQL")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	closed := "postgres://postgres@" + addr + "/postgres?sslmode=disable"
	ln.Close()
	helper := func(mode string) (string, error) {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
		cmd.Env = append(os.Environ(), "DBTEST_HELPER="+mode, "TEST_DATABASE_URL="+closed)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("OK_StartsOneAndStopsItAfterTheTests", func(t *testing.T) {
		out, err := helper("main")
		if err != nil {
			t.Fatalf("%v:\n%s", err, out)
		}
		m := regexp.MustCompile(`server (postgres://\S+)`).FindStringSubmatch(out)
		if m == nil || m[1] == closed {
			t.Fatalf("the helper used no server of its own:\n%s", out)
		}
		if !strings.Contains(out, "dbtest: ") || !strings.Contains(out, "nothing answered at "+addr) {
			t.Errorf("the helper does not say which server it started:\n%s", out)
		}
		if pgserver.Answers(t.Context(), m[1]) {
			t.Errorf("%s still answers after the helper's tests ended", m[1])
		}
	})
	t.Run("ErrWithoutMainStartsNone", func(t *testing.T) {
		out, err := helper("without-main")
		if err == nil || !strings.Contains(out, "func TestMain(m *testing.M) { dbtest.Main(m) }") {
			t.Errorf("without dbtest.Main: %v, want a failure naming the TestMain to add:\n%s", err, out)
		}
	})
}
