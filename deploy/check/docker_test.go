package check

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/mattn/go-shellwords"
	"golang.org/x/mod/semver"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open(path("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// makefileVars returns the Makefile's variable assignments (:=, ?=, =).
func makefileVars(t *testing.T) (map[string]string, map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(path("Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	recipes := map[string][]string{}
	assign := regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)\s*(?::=|\?=|=)\s*(.*)$`)
	target := regexp.MustCompile(`^([a-zA-Z0-9_.-]+):`)
	current := ""
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "\t") && current != "":
			recipes[current] = append(recipes[current], strings.TrimSpace(line))
		case assign.MatchString(line):
			m := assign.FindStringSubmatch(line)
			vars[m[1]] = strings.TrimSpace(m[2])
			current = ""
		case target.MatchString(line) && !strings.Contains(line, ":="):
			current = target.FindStringSubmatch(line)[1]
		default:
			current = ""
		}
	}
	return vars, recipes
}

var makeRef = regexp.MustCompile(`\$\(([A-Z_][A-Z0-9_]*)\)`)

// expandMake expands $(VAR) references, keeping those in keep as {VAR}.
func expandMake(s string, vars map[string]string, keep ...string) string {
	for range 10 {
		s = makeRef.ReplaceAllStringFunc(s, func(ref string) string {
			name := makeRef.FindStringSubmatch(ref)[1]
			if slices.Contains(keep, name) {
				return "{" + name + "}"
			}
			return vars[name]
		})
	}
	return s
}

var shellRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// goBuild is a `go build` command line: environment, flags, package.
type goBuild struct {
	env   map[string]string
	flags map[string]string // -flag → value ("" for booleans)
	pkg   string
}

// parseGoBuild parses "[VAR=value ...] go build [flags] package", dropping
// -o, whose value differs between the Makefile and the image.
func parseGoBuild(t *testing.T, line string) goBuild {
	t.Helper()
	p := shellwords.NewParser()
	words, err := p.Parse(line)
	if err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	g := goBuild{env: map[string]string{}, flags: map[string]string{}}
	i := 0
	for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
		k, v, _ := strings.Cut(words[i], "=")
		g.env[k] = v
	}
	if i+1 >= len(words) || filepath.Base(words[i]) != "go" || words[i+1] != "build" {
		t.Fatalf("not a go build command: %q", line)
	}
	valued := map[string]bool{"-ldflags": true, "-o": true, "-tags": true, "-gcflags": true, "-asmflags": true, "-mod": true, "-buildmode": true, "-p": true, "-pgo": true}
	for i += 2; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			g.pkg = w
			continue
		}
		name, val, hasVal := strings.Cut(w, "=")
		if !hasVal && valued[name] && i+1 < len(words) {
			i++
			val = words[i]
		}
		if name != "-o" {
			g.flags[name] = val
		}
	}
	return g
}

func TestDockerfile_BuildsLikeTheMakefile(t *testing.T) {
	vars, recipes := makefileVars(t)
	var makeLine string
	for _, l := range recipes["build"] {
		if strings.Contains(l, " build ") {
			makeLine = expandMake(l, vars, "VERSION")
		}
	}
	if makeLine == "" {
		t.Fatalf("the Makefile's build target runs no go build: %v", recipes["build"])
	}
	want := parseGoBuild(t, makeLine)

	var runLine string
	for _, in := range dockerfile(t) {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			runLine = in.args
		}
	}
	if runLine == "" {
		t.Fatal("the Dockerfile runs no go build")
	}
	if !strings.Contains(runLine, "--mount=type=cache,target=/go/pkg/mod") || !strings.Contains(runLine, "--mount=type=cache,target=/root/.cache/go-build") {
		t.Errorf("the Dockerfile's go build does not use cache mounts for modules and the build cache")
	}
	var words []string
	for _, w := range strings.Fields(runLine) {
		if !strings.HasPrefix(w, "--mount=") {
			words = append(words, w)
		}
	}
	// The image's ${VERSION} is the Makefile's $(VERSION).
	got := parseGoBuild(t, shellRef.ReplaceAllString(strings.Join(words, " "), "{$1}"))
	delete(got.env, "GOOS") // cross-compilation for the image's platform
	delete(got.env, "GOARCH")
	if !mapsEqual(got.env, want.env) {
		t.Errorf("Dockerfile builds with environment %v, the Makefile with %v", got.env, want.env)
	}
	if !mapsEqual(got.flags, want.flags) {
		t.Errorf("Dockerfile builds with flags %v, the Makefile with %v", got.flags, want.flags)
	}
	if got.pkg != want.pkg {
		t.Errorf("Dockerfile builds %s, the Makefile %s", got.pkg, want.pkg)
	}
	if want.env["CGO_ENABLED"] != "0" || !strings.Contains(want.flags["-ldflags"], "-X main.version={VERSION}") {
		t.Errorf("the Makefile's build is not static or not version-stamped: %v %v", want.env, want.flags)
	}
	if _, ok := want.flags["-trimpath"]; !ok {
		t.Errorf("the Makefile's build lacks -trimpath")
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestDockerfile_RunsNonRootWithoutAShell(t *testing.T) {
	ins := dockerfile(t)
	var froms []string
	args := map[string]string{}
	var user, entrypoint, cmd string
	for _, in := range ins {
		switch in.cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			if _, seen := args[k]; !seen {
				args[k] = v
			}
		case "FROM":
			froms = append(froms, in.args)
			user = "" // USER is per stage
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "CMD":
			cmd = in.args
		}
	}
	if len(froms) < 2 {
		t.Fatalf("the Dockerfile is not multi-stage: %v", froms)
	}
	final := strings.Fields(froms[len(froms)-1])[0]
	if !(strings.HasPrefix(final, "gcr.io/distroless/static") && strings.HasSuffix(final, ":nonroot")) && final != "scratch" {
		t.Errorf("the runtime image is %s, want distroless static nonroot (or scratch)", final)
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
		t.Errorf("the runtime stage runs as %q, want a non-root user", user)
	}
	var ep, c []string
	if json.Unmarshal([]byte(entrypoint), &ep) != nil || !slices.Equal(ep, []string{"/billing"}) {
		t.Errorf(`ENTRYPOINT %s, want ["/billing"] (exec form: there is no shell)`, entrypoint)
	}
	if json.Unmarshal([]byte(cmd), &c) != nil || !slices.Equal(c, []string{"serve"}) {
		t.Errorf(`CMD %s, want ["serve"]`, cmd)
	}
	// The runtime stage exposes serve's listeners at their defaults.
	var exposed []string
	for _, in := range ins {
		if in.cmd == "FROM" {
			exposed = nil
		}
		if in.cmd == "EXPOSE" {
			exposed = append(exposed, strings.Fields(in.args)...)
		}
	}
	for _, v := range []string{"HTTP_ADDR", "WEBHOOK_ADDR"} {
		p, err := port(serveDefault(t, v))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(exposed, strconv.Itoa(p)) && !slices.Contains(exposed, strconv.Itoa(p)+"/tcp") {
			t.Errorf("the runtime stage EXPOSEs %v, not %s's default port %d", exposed, v, p)
		}
	}

	// The builder's Go is at least the one go.mod asks for: the golang
	// image sets GOTOOLCHAIN=local and would not fetch a newer one.
	builder := strings.Fields(froms[0])
	image := builder[len(builder)-1]
	if len(builder) >= 3 && strings.EqualFold(builder[len(builder)-2], "AS") {
		image = builder[len(builder)-3]
	}
	image = shellRef.ReplaceAllStringFunc(image, func(ref string) string { return args[shellRef.FindStringSubmatch(ref)[1]] })
	tag, ok := strings.CutPrefix(image, "golang:")
	if !ok {
		t.Fatalf("the build stage is %s, want golang:<version>", image)
	}
	goVersion := goModVersion(t)
	imageVersion := "v" + strings.SplitN(tag, "-", 2)[0]
	if !semver.IsValid(imageVersion) || semver.Compare(imageVersion, "v"+goVersion) < 0 {
		t.Errorf("the build stage's Go %s is older than go.mod's go %s", tag, goVersion)
	}
}

func goModVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(path("go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go\s+(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return string(m[1])
}

// dockerignore is .dockerignore's patterns, matched as Docker does: the last
// pattern matching a path or one of its parents decides; "!" re-includes.
type dockerignore []struct {
	re     *regexp.Regexp
	negate bool
}

func loadDockerignore(t *testing.T) dockerignore {
	t.Helper()
	b, err := os.ReadFile(path(".dockerignore"))
	if err != nil {
		t.Fatalf("no .dockerignore: %v", err)
	}
	var d dockerignore
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		neg := strings.HasPrefix(line, "!")
		pat := filepath.ToSlash(filepath.Clean(strings.TrimPrefix(line, "!")))
		var re strings.Builder
		re.WriteString("^")
		for i := 0; i < len(pat); i++ {
			switch c := pat[i]; {
			case strings.HasPrefix(pat[i:], "**/"):
				re.WriteString("(.*/)?")
				i += 2
			case strings.HasPrefix(pat[i:], "**"):
				re.WriteString(".*")
				i++
			case c == '*':
				re.WriteString("[^/]*")
			case c == '?':
				re.WriteString("[^/]")
			default:
				re.WriteString(regexp.QuoteMeta(string(c)))
			}
		}
		re.WriteString("$")
		d = append(d, struct {
			re     *regexp.Regexp
			negate bool
		}{regexp.MustCompile(re.String()), neg})
	}
	return d
}

// excluded reports whether the build context leaves out rel.
func (d dockerignore) excluded(rel string) bool {
	rel = filepath.ToSlash(rel)
	parts := strings.Split(rel, "/")
	out := false
	for _, p := range d {
		for i := 1; i <= len(parts); i++ {
			if p.re.MatchString(strings.Join(parts[:i], "/")) {
				out = !p.negate
				break
			}
		}
	}
	return out
}

func TestDockerignore_KeepsWhatTheBuildNeeds(t *testing.T) {
	d := loadDockerignore(t)
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	goBin := "go"
	if p, err := exec.LookPath("go"); err == nil {
		goBin = p
	}
	list := exec.Command(goBin, "list", "-e", "-deps", "-f", `{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`, "./cmd/billing")
	list.Dir = absRoot
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		rel, err := filepath.Rel(absRoot, fields[0])
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module from the module cache
		}
		for _, f := range fields[1:] {
			needed = append(needed, filepath.Join(rel, f))
		}
	}
	if len(needed) < 10 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, n := range needed {
		if d.excluded(n) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", n)
		}
	}
	for _, n := range []string{".git/HEAD", "bin/billing", "deploy/base/deployment.yaml", "cmd/billing/pipeline_test.go"} {
		if !d.excluded(n) {
			t.Errorf(".dockerignore sends %s to the build context", n)
		}
	}
}
