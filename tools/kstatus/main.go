// kstatus computes the kstatus of Kubernetes objects with sigs.k8s.io/cli-utils' kstatus
// library, the library Flux, kpt and cli-utils' own apply use to judge whether an object is
// Current, InProgress, Failed, Terminating or NotFound.
//
// Usage:
//
//	kstatus OBJECTS.json...
//
// Each file holds one object or a List (kubectl get -o json), or YAML documents; "-" reads
// stdin. One JSON line per object is printed: {"kind","namespace","name","status","message"}.
// Bad input exits 2 with the file and the problem.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Message   string `json:"message"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kstatus OBJECTS.json...")
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, path := range os.Args[1:] {
		objs, err := load(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %s: %v\n", path, err)
			os.Exit(2)
		}
		for _, u := range objs {
			res, err := status.Compute(u)
			if err != nil {
				fmt.Fprintf(os.Stderr, "kstatus: %s %s/%s: %v\n", u.GetKind(), u.GetNamespace(), u.GetName(), err)
				os.Exit(1)
			}
			if err := out.Encode(result{
				Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(),
				Status: res.Status.String(), Message: res.Message,
			}); err != nil {
				os.Exit(1)
			}
		}
	}
}

// load reads objects the way the apiserver's clients decode them: integers stay int64, which
// kstatus' generation checks need.
func load(path string) ([]*unstructured.Unstructured, error) {
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var objs []*unstructured.Unstructured
	for {
		var doc json.RawMessage
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		if len(bytes.TrimSpace(doc)) == 0 || string(doc) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(doc); err != nil {
			return nil, fmt.Errorf("not a Kubernetes object: %w", err)
		}
		if u.IsList() {
			err := u.EachListItem(func(o runtime.Object) error {
				item, ok := o.(*unstructured.Unstructured)
				if !ok {
					return fmt.Errorf("a list item is not an object")
				}
				objs = append(objs, item)
				return nil
			})
			if err != nil {
				return nil, err
			}
			continue
		}
		objs = append(objs, u)
	}
	if len(objs) == 0 {
		return nil, errors.New("no objects")
	}
	return objs, nil
}
