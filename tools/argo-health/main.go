// argo-health runs Argo CD resource health checks (Lua) on Kubernetes objects, in the Lua VM
// Argo CD embeds (github.com/yuin/gopher-lua) and with the environment Argo CD gives a health
// script configured in argocd-cm: only the package, base and table libraries, the object as the
// global `obj`, a one-second deadline, and a returned table whose `status` must be one of
// Healthy, Progressing, Degraded, Suspended, Missing or Unknown.
//
// Usage:
//
//	argo-health --argocd-cm CM.yaml OBJECTS.json...
//	argo-health test DIR...
//
// CM.yaml is an argocd-cm ConfigMap (YAML or JSON) holding keys
// resource.customizations.health.<group>_<Kind>. Each OBJECTS file holds one object or a List
// (kubectl get -o json); "-" reads stdin. For every object the script of its group and kind is
// run and one JSON line is printed: {"kind","namespace","name","status","message"}. An object
// with no script, a script error or an invalid answer is an error (exit 1); bad input exits 2.
//
// `test` runs health scripts kept in Argo CD's own layout,
// <DIR>/<group>/<Kind>/health.lua beside a health_test.yaml:
//
//	tests:
//	  - healthStatus: {status: Healthy, message: "..."}
//	    inputPath: testdata/ready.yaml
//
// the way Argo CD's resource_customizations tests do: every script is loaded, run on each
// inputPath and its status and message compared with healthStatus, exactly. It also refuses a
// script without tests, a fixture of another group or kind than its directory names (Argo CD
// would run another script on it) and a testdata file no test uses. It prints one line per test
// and the differences; exit 1 when a test fails, 2 when the tree is malformed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	"sigs.k8s.io/yaml"
)

const keyPrefix = "resource.customizations.health."

// The health codes Argo CD accepts from a script.
var validStatus = map[string]bool{
	"Healthy": true, "Progressing": true, "Degraded": true,
	"Suspended": true, "Missing": true, "Unknown": true,
}

type result struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Message   string `json:"message"`
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "test" {
		os.Exit(runTests(os.Args[2:], os.Stdout))
	}
	cmPath := flag.String("argocd-cm", "", "the argocd-cm ConfigMap holding the health scripts (YAML or JSON)")
	flag.Parse()
	if *cmPath == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: argo-health --argocd-cm CM.yaml OBJECTS.json...\n       argo-health test DIR...")
		os.Exit(2)
	}
	scripts, err := loadScripts(*cmPath)
	if err != nil {
		fail(2, err)
	}
	failed := false
	out := json.NewEncoder(os.Stdout)
	for _, path := range flag.Args() {
		objs, err := loadObjects(path)
		if err != nil {
			fail(2, err)
		}
		for _, obj := range objs {
			r, err := health(scripts, obj)
			if err != nil {
				fmt.Fprintf(os.Stderr, "argo-health: %s: %v\n", describe(obj), err)
				failed = true
				continue
			}
			if err := out.Encode(r); err != nil {
				fail(1, err)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

func fail(code int, err error) {
	fmt.Fprintf(os.Stderr, "argo-health: %v\n", err)
	os.Exit(code)
}

func readInput(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(path)
}

// loadScripts reads the health scripts of an argocd-cm ConfigMap, by "<group>_<Kind>".
func loadScripts(path string) (map[string]string, error) {
	raw, err := readInput(path)
	if err != nil {
		return nil, err
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		return nil, fmt.Errorf("%s: not a ConfigMap: %w", path, err)
	}
	if cm.Kind != "ConfigMap" {
		return nil, fmt.Errorf("%s: kind is %q, want ConfigMap", path, cm.Kind)
	}
	scripts := map[string]string{}
	for k, v := range cm.Data {
		if strings.HasPrefix(k, keyPrefix) {
			scripts[strings.TrimPrefix(k, keyPrefix)] = v
		}
	}
	if len(scripts) == 0 {
		return nil, fmt.Errorf("%s: no %s<group>_<Kind> keys", path, keyPrefix)
	}
	return scripts, nil
}

// loadObjects reads one object or a List from JSON or YAML, keeping integers exact.
func loadObjects(path string) ([]map[string]any, error) {
	raw, err := readInput(path)
	if err != nil {
		return nil, err
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dec := json.NewDecoder(strings.NewReader(string(js)))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("%s: not a Kubernetes object: %w", path, err)
	}
	if kind, _ := obj["kind"].(string); strings.HasSuffix(kind, "List") {
		items, _ := obj["items"].([]any)
		out := make([]map[string]any, 0, len(items))
		for i, it := range items {
			m, ok := it.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: items[%d] is not an object", path, i)
			}
			out = append(out, m)
		}
		return out, nil
	}
	return []map[string]any{obj}, nil
}

func describe(obj map[string]any) string {
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	if ns != "" {
		return fmt.Sprintf("%v %s/%s", obj["kind"], ns, name)
	}
	return fmt.Sprintf("%v %s", obj["kind"], name)
}

// scriptKey is argocd-cm's key suffix for an object: "<group>_<Kind>" ("<Kind>" for the core group).
func scriptKey(obj map[string]any) string {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group := ""
	if i := strings.Index(apiVersion, "/"); i >= 0 {
		group = apiVersion[:i]
	}
	if group == "" {
		return kind
	}
	return group + "_" + kind
}

func health(scripts map[string]string, obj map[string]any) (*result, error) {
	script, ok := scripts[scriptKey(obj)]
	if !ok {
		return nil, fmt.Errorf("no health script %s%s", keyPrefix, scriptKey(obj))
	}
	return runScript(script, obj)
}

// runScript runs one health script on obj in the environment Argo CD gives a configured script.
func runScript(script string, obj map[string]any) (*result, error) {
	L := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer L.Close()
	// The libraries Argo CD opens for a configured script (its "safe" os library is left out:
	// a script that needs os is refused here rather than passing by accident).
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := L.CallByParam(lua.P{Fn: L.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	L.SetContext(ctx)
	L.SetGlobal("obj", toLua(L, obj))
	if err := L.DoString(script); err != nil {
		return nil, fmt.Errorf("script error: %w", err)
	}
	ret := L.Get(-1)
	tbl, ok := ret.(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("the script returned %s, not a table", ret.Type())
	}
	status := lua.LVAsString(tbl.RawGetString("status"))
	if !validStatus[status] {
		return nil, errors.New("the script returned an invalid health status " + fmt.Sprintf("%q", status))
	}
	meta, _ := obj["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	kind, _ := obj["kind"].(string)
	return &result{
		Kind: kind, Namespace: ns, Name: name,
		Status:  status,
		Message: lua.LVAsString(tbl.RawGetString("message")),
	}, nil
}

// toLua converts a decoded JSON value the way Argo CD converts an unstructured object: maps to
// tables with string keys, lists to 1-based tables, numbers to Lua numbers.
func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case bool:
		return lua.LBool(x)
	case string:
		return lua.LString(x)
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return lua.LString(x.String())
		}
		return lua.LNumber(f)
	case []any:
		t := L.CreateTable(len(x), 0)
		for _, item := range x {
			t.Append(toLua(L, item))
		}
		return t
	case map[string]any:
		t := L.CreateTable(0, len(x))
		for k, item := range x {
			t.RawSetH(lua.LString(k), toLua(L, item))
		}
		return t
	}
	return lua.LNil
}
