package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// healthTest is one entry of a health_test.yaml, as Argo CD's resource_customizations tests
// read it.
type healthTest struct {
	HealthStatus struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	} `json:"healthStatus"`
	InputPath string `json:"inputPath"`
}

type testFile struct {
	Tests []healthTest `json:"tests"`
}

// runTests runs every health_test.yaml under dirs; the exit code: 0 all passed, 1 a test failed,
// 2 the tree is malformed.
func runTests(dirs []string, out io.Writer) int {
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "usage: argo-health test DIR...")
		return 2
	}
	var scripts []string
	for _, root := range dirs {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && d.Name() == "health.lua" {
				scripts = append(scripts, path)
			}
			return nil
		})
		if err != nil {
			fmt.Fprintf(os.Stderr, "argo-health: %v\n", err)
			return 2
		}
	}
	if len(scripts) == 0 {
		fmt.Fprintf(os.Stderr, "argo-health: no health.lua under %s\n", strings.Join(dirs, ", "))
		return 2
	}
	sort.Strings(scripts)
	var malformed []string
	tests, failed := 0, 0
	for _, script := range scripts {
		n, f, problems := testScript(script, out)
		tests += n
		failed += f
		malformed = append(malformed, problems...)
	}
	for _, p := range malformed {
		fmt.Fprintf(out, "ERROR %s\n", p)
	}
	fmt.Fprintf(out, "argo-health test: %d scripts, %d tests, %d failed, %d errors\n", len(scripts), tests, failed, len(malformed))
	switch {
	case len(malformed) > 0:
		return 2
	case failed > 0:
		return 1
	}
	return 0
}

// testScript runs the tests of one health.lua; it returns how many ran, how many failed and
// what is wrong with the directory itself.
func testScript(scriptPath string, out io.Writer) (int, int, []string) {
	// The group and kind come from the path, so resolve it whatever the caller gave.
	if abs, err := filepath.Abs(scriptPath); err == nil {
		scriptPath = abs
	}
	dir := filepath.Dir(scriptPath)
	kind := filepath.Base(dir)
	group := filepath.Base(filepath.Dir(dir))
	name := group + "/" + kind
	src, err := os.ReadFile(scriptPath)
	if err != nil {
		return 0, 0, []string{err.Error()}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		return 0, 0, []string{fmt.Sprintf("%s: no health_test.yaml beside health.lua: %v", name, err)}
	}
	var tf testFile
	if err := yaml.UnmarshalStrict(raw, &tf); err != nil {
		return 0, 0, []string{fmt.Sprintf("%s/health_test.yaml: %v", name, err)}
	}
	if len(tf.Tests) == 0 {
		return 0, 0, []string{fmt.Sprintf("%s/health_test.yaml: no tests", name)}
	}
	var problems []string
	used := map[string]bool{}
	failed := 0
	for i, t := range tf.Tests {
		where := fmt.Sprintf("%s/%s", name, t.InputPath)
		if t.InputPath == "" || filepath.IsAbs(t.InputPath) || strings.HasPrefix(filepath.Clean(t.InputPath), "..") {
			problems = append(problems, fmt.Sprintf("%s/health_test.yaml: tests[%d]: inputPath %q must be a path inside %s", name, i, t.InputPath, dir))
			continue
		}
		if !validStatus[t.HealthStatus.Status] {
			problems = append(problems, fmt.Sprintf("%s: expected status %q is not an Argo CD health status", where, t.HealthStatus.Status))
			continue
		}
		input := filepath.Join(dir, t.InputPath)
		used[filepath.Clean(input)] = true
		objs, err := loadObjects(input)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		if len(objs) != 1 {
			problems = append(problems, fmt.Sprintf("%s: holds %d objects, want one", where, len(objs)))
			continue
		}
		obj := objs[0]
		if got := scriptKey(obj); got != group+"_"+kind {
			problems = append(problems, fmt.Sprintf("%s: the object is %s, but the script is for %s_%s (Argo CD picks the script by the object's group and kind)", where, got, group, kind))
			continue
		}
		r, err := runScript(string(src), obj)
		if err != nil {
			failed++
			fmt.Fprintf(out, "FAIL %s\n  want: %s %q\n  got:  error: %v\n", where, t.HealthStatus.Status, t.HealthStatus.Message, err)
			continue
		}
		if r.Status != t.HealthStatus.Status || r.Message != t.HealthStatus.Message {
			failed++
			fmt.Fprintf(out, "FAIL %s\n  want: %s %q\n  got:  %s %q\n", where, t.HealthStatus.Status, t.HealthStatus.Message, r.Status, r.Message)
			continue
		}
		fmt.Fprintf(out, "ok   %s: %s %q\n", where, r.Status, r.Message)
	}
	// A fixture no test reads is a state nobody checks.
	_ = filepath.WalkDir(filepath.Join(dir, "testdata"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() && !used[filepath.Clean(path)] {
			problems = append(problems, fmt.Sprintf("%s: %s is used by no test in health_test.yaml", name, path))
		}
		return nil
	})
	return len(tf.Tests), failed, problems
}
