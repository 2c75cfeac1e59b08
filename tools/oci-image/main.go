// oci-image assembles an OCI image from static binaries with no container engine, using
// go-containerregistry: one layer holding the binaries on an empty base (no shell, no libc),
// the config's user, entrypoint and labels set, every timestamp fixed so the same binaries give
// the same digest. It writes an OCI image layout as a tar archive (what `skopeo copy
// oci-archive:…`, `podman load` and `docker load` read) and prints the image's digest.
//
// Usage:
//
//	oci-image --out IMAGE.oci.tar --name REPOSITORY:TAG --file SRC=/DEST [--file ...]
//	          [--data SRC=/DIR/NAME ...] --entrypoint /DEST --user UID:GID [--label KEY=VALUE ...]
//	          [--created RFC3339]
//
// Every --file must be a statically linked ELF executable (the image has no libc and no
// loader); anything else is refused. A --data file (the SBOM) is put in read-only (0644), in its
// directory. The layout's index names the image twice: the tag as
// org.opencontainers.image.ref.name (OCI) and the full name as io.containerd.image.name (what
// `ctr images import`, and so `kind load image-archive`, uses).
package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	var files, data, labels multi
	out := flag.String("out", "", "the OCI archive to write")
	name := flag.String("name", "", "the image's name, REPOSITORY:TAG, e.g. ghcr.io/norskvideo/automanager-operator:0.1.0")
	entrypoint := flag.String("entrypoint", "", "the entrypoint, an absolute path inside the image")
	user := flag.String("user", "", "numeric UID:GID the process runs as (non-root)")
	created := flag.String("created", "1970-01-01T00:00:00Z", "the image's creation time (RFC 3339); fixed so builds are reproducible")
	flag.Var(&files, "file", "SRC=/DEST: a file to put in the image (mode 0755), repeatable")
	flag.Var(&data, "data", "SRC=/DIR/NAME: a data file to put in the image (mode 0644), repeatable")
	flag.Var(&labels, "label", "KEY=VALUE: an image label, repeatable")
	flag.Parse()
	if err := run(*out, *name, *entrypoint, *user, *created, files, data, labels); err != nil {
		fmt.Fprintf(os.Stderr, "oci-image: %v\n", err)
		os.Exit(2)
	}
}

func run(out, name, entrypoint, user, createdText string, files, data, labels []string) error {
	if out == "" || name == "" || entrypoint == "" || len(files) == 0 {
		return fmt.Errorf("--out, --name, --entrypoint and at least one --file are required")
	}
	slash := strings.LastIndex(name, "/")
	colon := strings.LastIndex(name, ":")
	if colon <= slash || colon == len(name)-1 {
		return fmt.Errorf("--name %q: want REPOSITORY:TAG", name)
	}
	if err := checkUser(user); err != nil {
		return err
	}
	created, err := time.Parse(time.RFC3339, createdText)
	if err != nil {
		return fmt.Errorf("--created %q: %w", createdText, err)
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		labelMap[k] = v
	}
	layerTar, dests, err := layerTar(files, data, created)
	if err != nil {
		return err
	}
	if !dests[entrypoint] {
		return fmt.Errorf("--entrypoint %s is not one of the files put in the image", entrypoint)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "oci-image (tools/oci-image)"},
	})
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = "amd64"
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: created}
	cfg.Config.User = user
	cfg.Config.Entrypoint = []string{entrypoint}
	cfg.Config.Cmd = nil
	cfg.Config.WorkingDir = "/"
	// What docker build (BuildKit) gives an image FROM scratch, so the Dockerfile's image and
	// this one have the same config.
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cfg.Config.Labels = labelMap
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := writeArchive(out, img, name, name[colon+1:]); err != nil {
		return err
	}
	fmt.Println(digest.String())
	return nil
}

// checkUser refuses anything but a numeric, non-root UID:GID: with no /etc/passwd in the image a
// name could not be resolved, and Kubernetes' runAsNonRoot can only verify a numeric user.
func checkUser(user string) error {
	uid, gid, ok := strings.Cut(user, ":")
	u, errU := strconv.ParseUint(uid, 10, 32)
	_, errG := strconv.ParseUint(gid, 10, 32)
	if !ok || errU != nil || errG != nil {
		return fmt.Errorf("--user %q: want numeric UID:GID", user)
	}
	if u == 0 {
		return fmt.Errorf("--user %q: the image must not run as root", user)
	}
	return nil
}

// layerTar is the single layer: each executable at its destination, owned by root, mode 0755
// (the runtime user can run it, not change it), each data file 0644 in its directory (0755),
// with the fixed time.
func layerTar(files, data []string, created time.Time) ([]byte, map[string]bool, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dests := map[string]bool{}
	dirs := map[string]bool{}
	put := func(flagName, src, dest string, mode int64, check bool) error {
		body, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("--%s %s: %w", flagName, src, err)
		}
		if check {
			if err := checkStatic(src, body); err != nil {
				return err
			}
		}
		if dir := filepath.Dir(dest); dir != "/" && !dirs[dir] {
			hdr := &tar.Header{
				Typeflag: tar.TypeDir, Name: dir[1:] + "/", Mode: 0o755,
				ModTime: created, Format: tar.FormatPAX,
			}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			dirs[dir] = true
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: dest[1:], Mode: mode, Size: int64(len(body)),
			ModTime: created, Uid: 0, Gid: 0, Format: tar.FormatPAX,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(body); err != nil {
			return err
		}
		dests[dest] = true
		return nil
	}
	for _, f := range files {
		src, dest, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(dest, "/") || strings.Contains(dest[1:], "/") {
			return nil, nil, fmt.Errorf("--file %q: want SRC=/NAME (a file at the image's root)", f)
		}
		if err := put("file", src, dest, 0o755, true); err != nil {
			return nil, nil, err
		}
	}
	for _, f := range data {
		src, dest, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(dest, "/") || strings.Count(dest, "/") != 2 || strings.Contains(dest, "..") {
			return nil, nil, fmt.Errorf("--data %q: want SRC=/DIR/NAME", f)
		}
		if err := put("data", src, dest, 0o644, false); err != nil {
			return nil, nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, nil, err
	}
	return buf.Bytes(), dests, nil
}

// checkStatic refuses anything but a statically linked ELF executable: no program
// interpreter (the dynamic loader) and no shared libraries needed.
func checkStatic(path string, body []byte) error {
	f, err := elf.NewFile(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("--file %s: not an ELF executable: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("--file %s: dynamically linked (it names a program interpreter); build it with -C target-feature=+crt-static (make static)", path)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("--file %s: needs shared libraries %v; build it statically (make static)", path, libs)
	}
	return nil
}

// writeArchive writes the image as an OCI layout in a temporary directory and packs it, in a
// fixed order with fixed times, into one tar file.
func writeArchive(out string, img v1.Image, name, tag string) error {
	dir, err := os.MkdirTemp("", "oci-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag,
		"io.containerd.image.name":          name,
	})); err != nil {
		return err
	}
	var paths []string
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	for _, path := range paths {
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if info.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		body, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, 0o644, int64(len(body))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := tw.Write(body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
