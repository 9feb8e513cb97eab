package importrules

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// seam is the one package that builds JetStream API and key-value
// subjects (besides nats.go itself, outside the module).
const seam = "internal/jsapi"

// apiMarks are what a string literal that spells a JetStream API or
// key-value subject, or a part of one, holds.
var apiMarks = []string{"$JS.", "$KV.", "JS.API", "STREAM.MSG.GET", "DIRECT.GET", "CONSUMER.MSG.NEXT"}

// TestNoAPISubjectOutsideTheSeam: no Go source of the module but the
// seam's spells a JetStream API or key-value subject in a string literal.
// Comments may name them, and so may tests (which watch the API's
// traffic); code asks internal/jsapi.
func TestNoAPISubjectOutsideTheSeam(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel == seam || name == "testdata" || name == "vendor" || (rel != "." && strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		files++
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, mark := range apiMarks {
				if strings.Contains(s, mark) {
					t.Errorf("%s: %s spells a JetStream subject (%q): build it with %s", fset.Position(lit.Pos()), lit.Value, mark, seam)
					break
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatalf("no Go source found under %s", root)
	}
}
