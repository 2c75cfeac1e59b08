// dockerfile-config prints the image config a Dockerfile's final stage gives, as BuildKit (the
// builder behind `docker build`) computes it, without building anything or pulling a base
// image: the Dockerfile is converted with BuildKit's own dockerfile2llb, and its image config
// (user, entrypoint, cmd, labels, env, working directory) is printed as JSON, with the
// destinations of the final stage's COPY instructions. A test compares it with the config of
// the image `make image` writes, so the two ways of building the image cannot drift apart.
//
// Base images are resolved to an empty config with no network: only the final stage's config
// matters, and in this repository that stage is FROM scratch.
//
// Usage:
//
//	dockerfile-config [--build-arg KEY=VALUE ...] Dockerfile
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerui"
	digest "github.com/opencontainers/go-digest"
	ocispecs "github.com/opencontainers/image-spec/specs-go/v1"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

// offline answers every base image with an empty linux/amd64 config.
type offline struct{}

func (offline) ResolveImageConfig(_ context.Context, ref string, _ sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	cfg := ocispecs.Image{Platform: ocispecs.Platform{OS: "linux", Architecture: "amd64"}}
	dt, err := json.Marshal(cfg)
	if err != nil {
		return "", "", nil, err
	}
	return ref, digest.FromBytes(dt), dt, nil
}

type output struct {
	User       string            `json:"user"`
	Entrypoint []string          `json:"entrypoint"`
	Cmd        []string          `json:"cmd"`
	Labels     map[string]string `json:"labels"`
	Env        []string          `json:"env"`
	WorkingDir string            `json:"workingDir"`
	OS         string            `json:"os"`
	Arch       string            `json:"architecture"`
	Copies     []string          `json:"copies"`
}

func main() {
	var args multi
	flag.Var(&args, "build-arg", "KEY=VALUE, as docker build --build-arg; repeatable")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: dockerfile-config [--build-arg KEY=VALUE ...] Dockerfile")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), args); err != nil {
		fmt.Fprintf(os.Stderr, "dockerfile-config: %v\n", err)
		os.Exit(1)
	}
}

func run(path string, args []string) error {
	dt, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	buildArgs := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return fmt.Errorf("--build-arg %q: want KEY=VALUE", a)
		}
		buildArgs[k] = v
	}
	platform := ocispecs.Platform{OS: "linux", Architecture: "amd64"}
	res, err := dockerfile2llb.Dockerfile2LLB(context.Background(), dt, dockerfile2llb.ConvertOpt{
		Config:         dockerui.Config{BuildArgs: buildArgs},
		TargetPlatform: &platform,
		MetaResolver:   offline{},
	})
	if err != nil {
		return fmt.Errorf("converting %s: %w", path, err)
	}
	copies, err := finalCopies(dt)
	if err != nil {
		return err
	}
	img := res.Image
	out := output{
		User:       img.Config.User,
		Entrypoint: img.Config.Entrypoint,
		Cmd:        img.Config.Cmd,
		Labels:     img.Config.Labels,
		Env:        img.Config.Env,
		WorkingDir: img.Config.WorkingDir,
		OS:         img.OS,
		Arch:       img.Architecture,
		Copies:     copies,
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// finalCopies lists the destinations of the last stage's COPY and ADD instructions.
func finalCopies(dt []byte) ([]string, error) {
	ast, err := parser.Parse(strings.NewReader(string(dt)))
	if err != nil {
		return nil, err
	}
	stages, _, err := instructions.Parse(ast.AST, nil)
	if err != nil {
		return nil, err
	}
	if len(stages) == 0 {
		return nil, fmt.Errorf("no stage")
	}
	var dests []string
	for _, cmd := range stages[len(stages)-1].Commands {
		switch c := cmd.(type) {
		case *instructions.CopyCommand:
			dests = append(dests, c.DestPath)
		case *instructions.AddCommand:
			dests = append(dests, c.DestPath)
		}
	}
	sort.Strings(dests)
	return dests, nil
}
