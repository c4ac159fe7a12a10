// Package docs holds the documents' checks: every Go block in README.md
// and docs/*.md is a copy of a function that a test compiles and runs, and
// every relative link in them and in BENCHMARKS.md resolves.
package docs

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/zinfio/zinf/config"
)

// root is the repository's root, seen from this package's directory.
const root = ".."

// documents are the Markdown files the checks read, relative to root.
func documents(t *testing.T, withBench bool) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(root, "README.md")}
	if withBench {
		files = append(files, filepath.Join(root, "BENCHMARKS.md"))
	}
	return append(files, docs...)
}

// block is one fenced code block of a Markdown file.
type block struct {
	lang   string
	line   int    // the opening fence's line, 1-based
	marker string // the last non-blank line before the fence
	text   string // the lines between the fences
}

// blocks returns the fenced code blocks of a Markdown text.
func blocks(md string) []block {
	var out []block
	lines := strings.Split(md, "\n")
	prev := ""
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if !strings.HasPrefix(l, "```") {
			if l != "" {
				prev = l
			}
			continue
		}
		indent := lines[i][:strings.Index(lines[i], "```")]
		b := block{lang: strings.TrimPrefix(l, "```"), line: i + 1, marker: prev}
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		b.text = strings.Join(body, "\n")
		out = append(out, b)
		prev = ""
	}
	return out
}

// markerRE is the comment that names a Go block's source: the file
// (relative to the repository's root) and the function.
var markerRE = regexp.MustCompile(`^<!-- go: (\S+) (\w+) -->$`)

// funcSource returns function name's declaration in file (its doc comment
// left out) and its body's lines, one indentation level removed, with
// tabs as four spaces as the documents show them.
func funcSource(file, name string) (decl, body string, err error) {
	src, err := os.ReadFile(file)
	if err != nil {
		return "", "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		return "", "", err
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != name || fd.Recv != nil {
			continue
		}
		text := string(src[fset.Position(fd.Pos()).Offset:fset.Position(fd.End()).Offset])
		lines := strings.Split(text, "\n")
		var inner []string
		for _, l := range lines[1 : len(lines)-1] {
			inner = append(inner, strings.TrimPrefix(l, "\t"))
		}
		spaces := func(s string) string { return strings.ReplaceAll(s, "\t", "    ") }
		return spaces(text), spaces(strings.Join(inner, "\n")), nil
	}
	return "", "", fmt.Errorf("no function %s in %s", name, file)
}

// firstDiff says where two texts part, line by line.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d of the block:\n  document: %q\n  source:   %q", i+1, gl, wl)
		}
	}
	return "equal"
}

// checkSnippets returns what is wrong with the Go blocks of one Markdown
// text (file names it in the messages) and how many there are.
func checkSnippets(file, md string) (problems []string, n int) {
	for _, b := range blocks(md) {
		if b.lang != "go" && b.lang != "golang" {
			continue
		}
		n++
		m := markerRE.FindStringSubmatch(b.marker)
		if m == nil {
			problems = append(problems, fmt.Sprintf("%s:%d: a Go block without a marker line <!-- go: FILE FUNCTION --> before it (last line before it: %q)", file, b.line, b.marker))
			continue
		}
		decl, body, err := funcSource(filepath.Join(root, m[1]), m[2])
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s:%d: %v", file, b.line, err))
			continue
		}
		want := body
		if strings.HasPrefix(b.text, "func ") {
			want = decl
		}
		if b.text != want {
			problems = append(problems, fmt.Sprintf("%s:%d: the block differs from %s's %s (copy the function into the document): %s", file, b.line, m[1], m[2], firstDiff(b.text, want)))
		}
	}
	return problems, n
}

// TestSnippets checks that every Go block of README.md and docs/*.md is
// preceded by a marker naming the function it shows, and equals that
// function line for line: its body, or the whole declaration when the
// block starts with "func". The functions live in test files that their
// packages' tests compile and run (snippets_test.go in the root,
// contrib/gomlx and contrib/gomlx/generate), so no Go code the documents
// show goes uncompiled or drifts from the API.
func TestSnippets(t *testing.T) {
	total := 0
	for _, file := range documents(t, false) {
		md, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		problems, n := checkSnippets(file, string(md))
		for _, p := range problems {
			t.Error(p)
		}
		total += n
	}
	if total == 0 {
		t.Fatal("no Go blocks found: the documents moved?")
	}
}

// TestSnippetsCatchDrift feeds the check blocks of this file's own slug
// function: a copy passes, whole or as its body; a changed line, a
// missing marker and an unknown function are each reported.
func TestSnippetsCatchDrift(t *testing.T) {
	decl, body, err := funcSource("snippets_test.go", "slug")
	if err != nil {
		t.Fatal(err)
	}
	marker := "<!-- go: docs/snippets_test.go slug -->\n"
	cases := []struct {
		name, md string
		bad      string // a piece of the one problem expected; "" for none
	}{
		{"declaration", marker + "```go\n" + decl + "\n```\n", ""},
		{"body", "text\n\n" + marker + "```go\n" + body + "\n```\n", ""},
		{"changed", marker + "```go\n" + strings.Replace(body, "'-'", "'+'", 1) + "\n```\n", "differs"},
		{"no marker", "```go\n" + body + "\n```\n", "without a marker"},
		{"unknown function", "<!-- go: docs/snippets_test.go nosuch -->\n```go\n" + body + "\n```\n", "no function nosuch"},
	}
	for _, c := range cases {
		problems, n := checkSnippets("x.md", c.md)
		if n != 1 {
			t.Errorf("%s: %d Go blocks, want 1", c.name, n)
		}
		switch {
		case c.bad == "" && len(problems) != 0:
			t.Errorf("%s: %v, want no problem", c.name, problems)
		case c.bad != "" && (len(problems) != 1 || !strings.Contains(problems[0], c.bad)):
			t.Errorf("%s: %v, want one problem saying %q", c.name, problems, c.bad)
		}
	}
}

// linkRE finds Markdown links and images: [text](target).
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// slug is GitHub's anchor for a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces as '-'.
func slug(h string) string {
	var b bytes.Buffer
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors returns the anchors of a Markdown file's headings.
func anchors(md string) map[string]bool {
	a := map[string]bool{}
	fence := false
	for l := range strings.SplitSeq(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(l, "#") {
			a[slug(strings.TrimLeft(l, "#"))] = true
		}
	}
	return a
}

// checkLinks returns the relative links and images of a Markdown text,
// outside code blocks, that do not resolve: the file or directory is
// missing, or an anchor names no heading of the Markdown file it points
// in. file is where the text lives; links resolve from its directory.
func checkLinks(file, md string) (problems []string, n int) {
	fence := false
	for i, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
		}
		if fence {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
			target := m[1]
			if schemeRE.MatchString(target) {
				continue // http:, https:, mailto:
			}
			n++
			path, anchor, _ := strings.Cut(target, "#")
			dest := file // an anchor in the same text
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(dest); err != nil {
					problems = append(problems, fmt.Sprintf("%s:%d: link %q: %v", file, i+1, target, err))
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			text := md
			if dest != file {
				b, err := os.ReadFile(dest)
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s:%d: link %q: %v", file, i+1, target, err))
					continue
				}
				text = string(b)
			}
			if !anchors(text)[anchor] {
				problems = append(problems, fmt.Sprintf("%s:%d: link %q: no heading with anchor #%s in %s", file, i+1, target, anchor, dest))
			}
		}
	}
	return problems, n
}

// schemeRE is a link's scheme (http:, https:, mailto:).
var schemeRE = regexp.MustCompile(`^[a-z]+:`)

// TestLinks checks every relative link and image of README.md,
// BENCHMARKS.md and docs/*.md, outside code blocks: the file or directory
// exists, and an anchor names a heading of the Markdown file it points in.
func TestLinks(t *testing.T) {
	total := 0
	for _, file := range documents(t, true) {
		md, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		problems, n := checkLinks(file, string(md))
		for _, p := range problems {
			t.Error(p)
		}
		total += n
	}
	if total == 0 {
		t.Fatal("no relative links found: the documents moved?")
	}
}

// TestLinksCatchBreakage: a missing file, a missing anchor and a missing
// anchor in the same file are reported; good links, links in code blocks
// and absolute URLs are not.
func TestLinksCatchBreakage(t *testing.T) {
	md := "# Top\n\n## A section\n\n" +
		"[ok](config.md) [ok](config.md#errors) [ok](#a-section) [web](https://example.com/x)\n" +
		"[gone](nosuch.md) [no anchor](config.md#nosuch) [no local anchor](#nowhere)\n" +
		"```\n[in code](nosuch2.md)\n```\n"
	problems, n := checkLinks("doc.md", md)
	if n != 6 {
		t.Errorf("%d relative links counted, want 6", n)
	}
	want := []string{"nosuch.md", "#nosuch", "#nowhere"}
	if len(problems) != len(want) {
		t.Fatalf("problems %q, want %d", problems, len(want))
	}
	for i, w := range want {
		if !strings.Contains(problems[i], w) {
			t.Errorf("problem %d %q does not name %q", i, problems[i], w)
		}
	}
}

// TestConfigExamples parses every JSON block of README.md and docs/*.md
// that is a config (it has a zero_optimization or zinf section) with
// config.Parse: the examples the documents give are configs zinf takes.
func TestConfigExamples(t *testing.T) {
	n := 0
	for _, file := range documents(t, false) {
		md, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks(string(md)) {
			if b.lang != "json" || !strings.Contains(b.text, `"zero_optimization"`) && !strings.Contains(b.text, `"zinf"`) {
				continue
			}
			n++
			if _, err := config.Parse([]byte(b.text)); err != nil {
				t.Errorf("%s:%d: the config example does not parse: %v", file, b.line, err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no config examples found: the documents moved?")
	}
}
