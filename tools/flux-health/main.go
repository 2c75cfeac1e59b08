// flux-health evaluates the CEL health checks of Flux Kustomizations (`spec.healthCheckExprs`,
// Flux >= 2.5) the way kustomize-controller does (fluxcd/pkg runtime/cel: the same cel-go
// environment, the expression parsed, not type-checked, the object as the activation), on the
// objects of Argo CD health tests, and checks that both tools read every object alike.
//
// Usage:
//
//	flux-health --kustomization FILE --argo-tests DIR
//
// FILE holds one or more YAML documents; every Kustomization among them contributes its
// healthCheckExprs. DIR is searched for health_test.yaml files in Argo CD's layout
// (<group>/<Kind>/health_test.yaml, inputPath relative to it). For each test object of a kind
// the expressions cover, Flux's verdict is computed as Flux computes it:
//
//  1. status.observedGeneration present and different from metadata.generation: InProgress;
//  2. else the first of inProgress, failed, current that is true: InProgress, Failed, Current;
//  3. else InProgress. An expression that cannot be evaluated (an object with no status yet)
//     is Unknown, which Flux's poller treats as not ready yet and waits on.
//
// and compared with the Argo CD health the test expects: Healthy and Suspended are Current
// (done, as the spec asked), Progressing is InProgress (Unknown when the object has no status),
// Degraded is Failed. Exit 1 when a verdict differs, 2 when the input is malformed (an
// expression that does not parse, a kind with expressions and no test object, a test object
// of this group with no expressions).
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	"sigs.k8s.io/yaml"
)

type exprs struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Current    string `json:"current"`
	InProgress string `json:"inProgress"`
	Failed     string `json:"failed"`
}

type evaluator struct {
	name                       string
	current, failed, inProgres cel.Program
	used                       int
}

func compile(env *cel.Env, src string) (cel.Program, error) {
	if src == "" {
		return nil, nil
	}
	ast, iss := env.Parse(src)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("%q: %v", src, iss.Err())
	}
	return env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.InterruptCheckFrequency(100))
}

// flux's environment (fluxcd/pkg runtime/cel NewExpression).
func newEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.HomogeneousAggregateLiterals(),
		cel.EagerlyValidateDeclarations(true),
		cel.DefaultUTCTimeZone(true),
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(),
		ext.Sets(),
		ext.Encoders(),
	)
}

func eval(p cel.Program, obj map[string]any) (bool, error) {
	v, _, err := p.ContextEval(context.Background(), obj)
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, fmt.Errorf("not a boolean: %v", v)
	}
	return bool(b), nil
}

// verdict is Flux's StatusEvaluator.Evaluate, with an evaluation error read as Unknown.
func (e *evaluator) verdict(obj map[string]any) (string, error) {
	meta, _ := obj["metadata"].(map[string]any)
	st, _ := obj["status"].(map[string]any)
	if og, ok := st["observedGeneration"]; ok {
		if g, ok := meta["generation"]; ok && fmt.Sprint(og) != fmt.Sprint(g) {
			return "InProgress", nil
		}
	}
	for _, step := range []struct {
		p      cel.Program
		status string
	}{{e.inProgres, "InProgress"}, {e.failed, "Failed"}, {e.current, "Current"}} {
		if step.p == nil {
			continue
		}
		ok, err := eval(step.p, obj)
		if err != nil {
			return "Unknown", err
		}
		if ok {
			return step.status, nil
		}
	}
	return "InProgress", nil
}

type healthTest struct {
	HealthStatus struct {
		Status string `json:"status"`
	} `json:"healthStatus"`
	InputPath string `json:"inputPath"`
}

func main() {
	ksPath := flag.String("kustomization", "", "YAML holding Flux Kustomizations with healthCheckExprs")
	testsDir := flag.String("argo-tests", "", "a directory of Argo CD health tests (<group>/<Kind>/health_test.yaml)")
	flag.Parse()
	if *ksPath == "" || *testsDir == "" {
		fmt.Fprintln(os.Stderr, "usage: flux-health --kustomization FILE --argo-tests DIR")
		os.Exit(2)
	}
	os.Exit(run(*ksPath, *testsDir))
}

func bad(format string, a ...any) int {
	fmt.Fprintf(os.Stderr, "flux-health: "+format+"\n", a...)
	return 2
}

func run(ksPath, testsDir string) int {
	raw, err := os.ReadFile(ksPath)
	if err != nil {
		return bad("%v", err)
	}
	env, err := newEnv()
	if err != nil {
		return bad("%v", err)
	}
	evals := map[string]*evaluator{}
	for i, doc := range strings.Split("\n"+string(raw), "\n---") {
		var ks struct {
			Kind string `json:"kind"`
			Spec struct {
				HealthCheckExprs []exprs `json:"healthCheckExprs"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &ks); err != nil {
			return bad("%s: document %d: %v", ksPath, i, err)
		}
		if ks.Kind != "Kustomization" {
			continue
		}
		for _, x := range ks.Spec.HealthCheckExprs {
			key := x.APIVersion + "/" + x.Kind
			if x.Current == "" {
				return bad("%s: %s: current is required", ksPath, key)
			}
			e := &evaluator{name: key}
			for _, c := range []struct {
				dst *cel.Program
				src string
			}{{&e.current, x.Current}, {&e.failed, x.Failed}, {&e.inProgres, x.InProgress}} {
				p, err := compile(env, c.src)
				if err != nil {
					return bad("%s: %s: %v", ksPath, key, err)
				}
				*c.dst = p
			}
			evals[key] = e
		}
	}
	if len(evals) == 0 {
		return bad("%s: no Kustomization with healthCheckExprs", ksPath)
	}
	groups := map[string]bool{}
	for k := range evals {
		groups[strings.SplitN(k, "/", 2)[0]] = true
	}

	var testFiles []string
	_ = filepath.WalkDir(testsDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "health_test.yaml" {
			testFiles = append(testFiles, p)
		}
		return err
	})
	sort.Strings(testFiles)
	expect := map[string]string{"Healthy": "Current", "Suspended": "Current", "Progressing": "InProgress", "Degraded": "Failed"}
	failed, problems, n := 0, 0, 0
	for _, tf := range testFiles {
		dir := filepath.Dir(tf)
		raw, err := os.ReadFile(tf)
		if err != nil {
			return bad("%v", err)
		}
		var file struct {
			Tests []healthTest `json:"tests"`
		}
		if err := yaml.Unmarshal(raw, &file); err != nil {
			return bad("%s: %v", tf, err)
		}
		for _, t := range file.Tests {
			path := filepath.Join(dir, t.InputPath)
			raw, err := os.ReadFile(path)
			if err != nil {
				return bad("%v", err)
			}
			var obj map[string]any
			if err := yaml.Unmarshal(raw, &obj); err != nil {
				return bad("%s: %v", path, err)
			}
			apiVersion, _ := obj["apiVersion"].(string)
			kind, _ := obj["kind"].(string)
			group := strings.SplitN(apiVersion, "/", 2)[0]
			e, ok := evals[apiVersion+"/"+kind]
			if !ok {
				if groups[group] {
					fmt.Printf("ERROR %s: no healthCheckExprs for %s %s\n", path, apiVersion, kind)
					problems++
				}
				continue
			}
			e.used++
			n++
			want, ok := expect[t.HealthStatus.Status]
			if !ok {
				fmt.Printf("ERROR %s: Argo CD health %q has no Flux equivalent here\n", path, t.HealthStatus.Status)
				problems++
				continue
			}
			got, err := e.verdict(obj)
			_, hasStatus := obj["status"]
			if got == want || (got == "Unknown" && want == "InProgress" && !hasStatus) {
				note := ""
				if err != nil {
					note = " (" + err.Error() + ")"
				}
				fmt.Printf("ok   %s: %s%s (Argo CD %s)\n", path, got, note, t.HealthStatus.Status)
				continue
			}
			failed++
			detail := ""
			if err != nil {
				detail = ": " + err.Error()
			}
			fmt.Printf("FAIL %s\n  want: %s (Argo CD %s)\n  got:  %s%s\n", path, want, t.HealthStatus.Status, got, detail)
		}
	}
	keys := make([]string, 0, len(evals))
	for k := range evals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if evals[k].used == 0 {
			fmt.Printf("ERROR healthCheckExprs for %s: no test object exercises them\n", k)
			problems++
		}
	}
	fmt.Printf("flux-health: %d kinds, %d objects, %d differ, %d errors\n", len(evals), n, failed, problems)
	switch {
	case problems > 0:
		return 2
	case failed > 0:
		return 1
	}
	return 0
}
