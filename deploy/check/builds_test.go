package check

import (
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// vetBuild is one way the tree is built: GOOS and tags, over patterns.
type vetBuild struct {
	name     string
	goos     string
	tags     string
	patterns []string
}

// vettedBuilds are the builds make vet and make lint check, from the
// Makefile: a release's (no tag), one per tag of BUILD_TAGS, on Linux; and
// DARWIN_PACKAGES on a Mac.
func vettedBuilds(t *testing.T) []vetBuild {
	t.Helper()
	vars, recipes := makefileVars(t)
	for _, target := range []string{"vet", "staticcheck"} {
		recipe := strings.Join(recipes[target], "\n")
		for _, v := range []string{"$(BUILD_TAGS)", "$(DARWIN_PACKAGES)"} {
			if !strings.Contains(recipe, v) {
				t.Errorf("make %s does not check %s:\n%s", target, v, recipe)
			}
		}
	}
	builds := []vetBuild{{name: "release", goos: "linux", patterns: []string{"./..."}}}
	for _, tag := range strings.Fields(vars["BUILD_TAGS"]) {
		builds = append(builds, vetBuild{name: tag, goos: "linux", tags: tag, patterns: []string{"./..."}})
	}
	darwin := strings.Fields(vars["DARWIN_PACKAGES"])
	if len(darwin) == 0 {
		t.Fatal("the Makefile sets no DARWIN_PACKAGES")
	}
	return append(builds, vetBuild{name: "darwin", goos: "darwin", patterns: darwin})
}

// compiledFiles are the Go files b compiles, tests included, as absolute
// paths.
func compiledFiles(t *testing.T, absRoot string, b vetBuild) map[string]bool {
	t.Helper()
	goBin := "go"
	if p, err := exec.LookPath("go"); err == nil {
		goBin = p
	}
	const each = `{{range .GoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{range .CgoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}` +
		`{{range .TestGoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{range .XTestGoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}`
	args := []string{"list", "-e", "-f", each}
	if b.tags != "" {
		args = append(args, "-tags", b.tags)
	}
	cmd := exec.Command(goBin, append(args, b.patterns...)...)
	cmd.Dir = absRoot
	cmd.Env = append(os.Environ(), "GOOS="+b.goos, "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list (%s): %v", b.name, err)
	}
	files := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		files[f] = true
	}
	return files
}

// moduleGoFiles are the Go files of billing's module as the go command sees
// them: no testdata, no directory starting with . or _, and no nested module
// (deploy/check, and tools/, whose tools.go only pins versions and is never
// built).
func moduleGoFiles(t *testing.T, absRoot string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(absRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != absRoot && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || exists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestMakeVet_ChecksEveryFile: every Go file of billing's module is in one
// of the builds make vet and make lint check, and every tag they check adds
// files, so that no file behind a build constraint goes unchecked (the
// next release's and the seed design's did, until issue 43). A new tag
// goes into BUILD_TAGS; a package with files of its own off Linux, into
// DARWIN_PACKAGES.
func TestMakeVet_ChecksEveryFile(t *testing.T) {
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	builds := vettedBuilds(t)
	release := compiledFiles(t, absRoot, builds[0])
	vetted := maps.Clone(release)
	for _, b := range builds[1:] {
		files := compiledFiles(t, absRoot, b)
		added := 0
		for f := range files {
			if !release[f] {
				added++
			}
			vetted[f] = true
		}
		if added == 0 {
			t.Errorf("build %s (GOOS=%s, tags %q) compiles no file a release does not: drop it from the Makefile", b.name, b.goos, b.tags)
		}
	}
	all := moduleGoFiles(t, absRoot)
	if len(all) < 100 || len(release) < 100 {
		t.Fatalf("found %d Go files, %d of them in a release's build", len(all), len(release))
	}
	for _, f := range all {
		if !vetted[f] {
			rel, _ := filepath.Rel(absRoot, f)
			t.Errorf("%s is in none of the builds make vet checks (%s): add its tag to BUILD_TAGS, or its package to DARWIN_PACKAGES", rel, strings.Join(names(builds), ", "))
		}
	}
}

func names(builds []vetBuild) []string {
	var out []string
	for _, b := range builds {
		out = append(out, b.name)
	}
	return out
}
