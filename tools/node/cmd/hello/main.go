// hello is the node smoke test's workload, a static binary with no libc so its image is one
// file. It serves HTTP, and it is also the client the test runs inside a Pod (there is no
// shell or curl in the image):
//
//	hello serve [--addr :8080]          GET / answers "hello from HOSTNAME"; GET /healthz "ok"
//	hello get URL [--ca FILE] [--token FILE] [--want STATUS]
//	                                     prints the status line and body; exits 1 unless the status
//	                                     is STATUS (default 200)
//	hello lookup NAME                    prints the addresses NAME resolves to
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "get":
		get(os.Args[2:])
	case "lookup":
		lookup(os.Args[2:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: hello serve [--addr :8080] | get URL [--ca FILE] [--token FILE] [--want STATUS] | lookup NAME")
	os.Exit(2)
}

func serve(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", ":8080", "listen address")
	fs.Parse(args)
	host, _ := os.Hostname()
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s (%s %s)\n", host, r.Method, r.URL.Path)
	})
	log.Printf("hello: serving on %s", *addr)
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

func get(args []string) {
	if len(args) < 1 {
		usage()
	}
	url := args[0]
	fs := flag.NewFlagSet("get", flag.ExitOnError)
	ca := fs.String("ca", "", "PEM file of the CA to trust for https")
	token := fs.String("token", "", "file holding a bearer token")
	want := fs.Int("want", 200, "the status that counts as success")
	fs.Parse(args[1:])
	tr := &http.Transport{}
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			log.Fatal(err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			log.Fatalf("no certificate in %s", *ca)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		log.Fatal(err)
	}
	if *token != "" {
		t, err := os.ReadFile(*token)
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(t)))
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Printf("%s\n%s", resp.Status, body)
	if resp.StatusCode != *want {
		os.Exit(1)
	}
}

func lookup(args []string) {
	if len(args) != 1 {
		usage()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, args[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(strings.Join(addrs, " "))
}
