package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// markdownLink is a link or image target in Markdown: ](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks fails on a relative link of README.md, BENCHMARKS.md or
// docs/*.md to a file that does not exist, or to a heading (#anchor) the
// file does not have: documents move, and a newcomer follows the links.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "BENCHMARKS.md"))
	for _, doc := range docs {
		for _, bad := range brokenLinks(t, doc) {
			t.Errorf("%s: broken link %s", doc, bad)
		}
	}
}

// brokenLinks returns doc's relative links whose file or anchor is missing.
func brokenLinks(t *testing.T, doc string) []string {
	t.Helper()
	text, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for _, m := range markdownLink.FindAllStringSubmatch(string(text), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		path, anchor, _ := strings.Cut(target, "#")
		file := doc
		if path != "" {
			file = filepath.Join(filepath.Dir(doc), path)
		}
		if _, err := os.Stat(file); err != nil {
			bad = append(bad, target+" (no such file)")
			continue
		}
		if anchor != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[anchor] {
			bad = append(bad, target+" (no such heading)")
		}
	}
	return bad
}

// anchors are the heading anchors of a Markdown file as GitHub makes them:
// lower case, punctuation other than - and _ dropped, spaces as hyphens.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for line := range strings.SplitSeq(string(text), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}

// The check itself: a missing file and a missing heading are found.
func TestDocsLinks_FindsBrokenOnes(t *testing.T) {
	t.Parallel()
	doc := filepath.Join(t.TempDir(), "doc.md")
	body := "# Title\n\n## A section (`x.y`)\n\n[ok](#a-section-xy) [self](doc.md#title) [gone](missing.md) [nohead](#nowhere)\n"
	if err := os.WriteFile(doc, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got := brokenLinks(t, doc)
	want := []string{"missing.md (no such file)", "#nowhere (no such heading)"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("brokenLinks = %q, want %q", got, want)
	}
}
