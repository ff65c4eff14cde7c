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

// stage is one stage of the Dockerfile: the image it starts from, its name
// (after AS) and its instructions after the FROM.
type stage struct {
	from, name string
	ins        []instruction
}

// dockerStages splits the Dockerfile into its stages; the last is the
// image that ships.
func dockerStages(t *testing.T) []stage {
	t.Helper()
	var stages []stage
	for _, in := range dockerfile(t) {
		if in.cmd == "FROM" {
			words := strings.Fields(in.args)
			name := ""
			if len(words) >= 3 && strings.EqualFold(words[len(words)-2], "AS") {
				name = words[len(words)-1]
			}
			stages = append(stages, stage{from: words[len(words)-1], name: name})
			if name != "" {
				stages[len(stages)-1].from = words[len(words)-3]
			}
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	if len(stages) == 0 {
		t.Fatal("the Dockerfile has no FROM")
	}
	return stages
}

// binaryBuild returns the RUN line that builds the /billing an image stage
// copies: the go build of the stage its COPY --from names.
func binaryBuild(t *testing.T, stages []stage, image stage) string {
	t.Helper()
	from := ""
	for _, in := range image.ins {
		if in.cmd == "COPY" && strings.HasSuffix(in.args, " /billing") && strings.HasPrefix(in.args, "--from=") {
			from, _, _ = strings.Cut(strings.TrimPrefix(in.args, "--from="), " ")
		}
	}
	for _, st := range stages {
		if st.name == from && from != "" {
			for _, in := range st.ins {
				if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
					return in.args
				}
			}
		}
	}
	t.Fatalf("the Dockerfile's stage %q copies /billing from %q, which runs no go build", image.name, from)
	return ""
}

// TestDockerfile_BuildsLikeTheMakefile: the image that ships (the last
// stage) carries make build's binary, the target dev make dev's.
func TestDockerfile_BuildsLikeTheMakefile(t *testing.T) {
	vars, recipes := makefileVars(t)
	stages := dockerStages(t)
	images := map[string]stage{"build": stages[len(stages)-1]}
	for _, st := range stages {
		if st.name == devTarget {
			images["dev"] = st
		}
	}
	if _, ok := images["dev"]; !ok {
		t.Errorf("the Dockerfile has no stage %s, the developer build's image (docker-compose.yml's fake provider)", devTarget)
	}
	for target, image := range images {
		var makeLine string
		for _, l := range recipes[target] {
			if strings.Contains(l, " build ") {
				makeLine = expandMake(l, vars, "VERSION")
			}
		}
		if makeLine == "" {
			t.Fatalf("the Makefile's %s target runs no go build: %v", target, recipes[target])
		}
		want := parseGoBuild(t, makeLine)
		runLine := binaryBuild(t, stages, image)
		if !strings.Contains(runLine, "--mount=type=cache,target=/go/pkg/mod") || !strings.Contains(runLine, "--mount=type=cache,target=/root/.cache/go-build") {
			t.Errorf("the Dockerfile's go build for make %s does not use cache mounts for modules and the build cache", target)
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
			t.Errorf("Dockerfile builds make %s's binary with environment %v, the Makefile with %v", target, got.env, want.env)
		}
		if !mapsEqual(got.flags, want.flags) {
			t.Errorf("Dockerfile builds make %s's binary with flags %v, the Makefile with %v", target, got.flags, want.flags)
		}
		if got.pkg != want.pkg {
			t.Errorf("Dockerfile builds %s for make %s, the Makefile %s", got.pkg, target, want.pkg)
		}
		if want.env["CGO_ENABLED"] != "0" || !strings.Contains(want.flags["-ldflags"], "-X main.version={VERSION}") {
			t.Errorf("make %s is not static or not version-stamped: %v %v", target, want.env, want.flags)
		}
		if _, ok := want.flags["-trimpath"]; !ok {
			t.Errorf("make %s lacks -trimpath", target)
		}
		if tags, dev := want.flags["-tags"], target == "dev"; dev != (tags == "dev") {
			t.Errorf("make %s builds with tags %q: the developer build alone has the tag dev", target, tags)
		}
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

// TestDockerfile_DevImageRunsNonRootWithoutAShell: the developer build's
// image, which docker-compose.yml's fake provider and producer run, is
// built as the one that ships.
func TestDockerfile_DevImageRunsNonRootWithoutAShell(t *testing.T) {
	for _, st := range dockerStages(t) {
		if st.name != devTarget {
			continue
		}
		if !strings.HasPrefix(st.from, "gcr.io/distroless/static") || !strings.HasSuffix(st.from, ":nonroot") {
			t.Errorf("the stage %s starts from %s, want distroless static nonroot", st.name, st.from)
		}
		var user, entrypoint string
		for _, in := range st.ins {
			switch in.cmd {
			case "USER":
				user = in.args
			case "ENTRYPOINT":
				entrypoint = in.args
			}
		}
		if uid, _, _ := strings.Cut(user, ":"); uid == "" || uid == "0" || uid == "root" {
			t.Errorf("the stage %s runs as %q, want a non-root user", st.name, user)
		}
		var ep []string
		if json.Unmarshal([]byte(entrypoint), &ep) != nil || !slices.Equal(ep, []string{"/billing"}) {
			t.Errorf(`the stage %s's ENTRYPOINT is %s, want ["/billing"]`, st.name, entrypoint)
		}
		return
	}
	t.Errorf("the Dockerfile has no stage %s", devTarget)
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

// listBilling runs go list -deps with format on cmd/billing as the build
// with tags (none: the one that ships) compiles it for the image.
func listBilling(t *testing.T, absRoot, format string, tags ...string) string {
	t.Helper()
	goBin := "go"
	if p, err := exec.LookPath("go"); err == nil {
		goBin = p
	}
	list := exec.Command(goBin, append(append([]string{"list", "-e", "-deps", "-f", format}, tags...), "./cmd/billing")...)
	list.Dir = absRoot
	list.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOFLAGS=")
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list %v: %v", tags, err)
	}
	return string(out)
}

// TestImage_LinksNoFakes: the build that ships (make build, the image)
// imports no developer package (internal/dev: the fake provider, the
// embedded broker, the load generator, the PostgreSQL downloader) and no
// test environment, and links no franz-go (kfake); the developer build
// does, so that this test would see them.
func TestImage_LinksNoFakes(t *testing.T) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	fake := func(line string) bool {
		pkg, module, _ := strings.Cut(line, " ")
		return strings.HasPrefix(pkg, "example.com/billing/internal/dev/") ||
			strings.HasPrefix(pkg, "example.com/billing/internal/testenv/") ||
			strings.HasPrefix(module, "github.com/twmb/franz-go")
	}
	const format = `{{.ImportPath}} {{with .Module}}{{.Path}}{{end}}`
	for _, line := range strings.Split(strings.TrimSpace(listBilling(t, absRoot, format)), "\n") {
		if fake(line) {
			t.Errorf("the build that ships links %s: a developer's package belongs to the developer build (-tags dev) only", line)
		}
	}
	dev := strings.Split(strings.TrimSpace(listBilling(t, absRoot, format, "-tags", "dev")), "\n")
	if !slices.ContainsFunc(dev, fake) {
		t.Errorf("the developer build links no fake either: is this test still looking at the right packages?")
	}
}

func TestDockerignore_KeepsWhatTheBuildNeeds(t *testing.T) {
	d := loadDockerignore(t)
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	// The image that ships and the developer build's (the target dev).
	const format = `{{if not .Standard}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}`
	out := listBilling(t, absRoot, format) + "\n" + listBilling(t, absRoot, format, "-tags", "dev")
	needed := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
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
