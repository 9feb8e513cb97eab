// Command testsum reads `go test -json` on stdin, prints the output of
// failed and skipped tests, and a closing line "N passed, N failed, N
// skipped". It exits non-zero on any failure or skip: a test that skips (a
// missing test host, say) must never pass as green.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	out := map[string][]string{}
	var passed, failed, skipped []string
	pkgFailed := map[string]bool{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			fmt.Println(sc.Text()) // build errors come as plain text
			continue
		}
		key := ev.Package + " " + ev.Test
		switch ev.Action {
		case "output":
			out[key] = append(out[key], ev.Output)
		case "pass":
			if ev.Test != "" {
				passed = append(passed, key)
			}
			delete(out, key)
		case "fail":
			if ev.Test == "" {
				pkgFailed[ev.Package] = true
			} else {
				failed = append(failed, key)
			}
		case "skip":
			if ev.Test != "" {
				skipped = append(skipped, key)
			} else if !strings.Contains(strings.Join(out[key], ""), "no test files") {
				skipped = append(skipped, key+"(package)")
			}
		}
	}
	show := func(title string, keys []string) {
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Printf("--- %s %s\n%s", title, k, strings.Join(out[k], ""))
		}
	}
	show("FAIL", failed)
	show("SKIP", skipped)
	for p := range pkgFailed {
		if len(out[p+" "]) > 0 {
			fmt.Printf("--- FAIL package %s\n%s", p, strings.Join(out[p+" "], ""))
		}
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", len(passed), len(failed)+len(pkgFailed)*boolInt(len(failed) == 0), len(skipped))
	if len(failed) > 0 || len(pkgFailed) > 0 || len(skipped) > 0 {
		if len(skipped) > 0 {
			fmt.Println("skipped tests count as failures: every test must run")
		}
		os.Exit(1)
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
