// forward copies TCP connections from one listening address to another, both on this machine.
// The node uses it to make the loopback-only kube-apiserver reachable from Pods: it listens on
// the bridge's address (10.244.0.1), and the `kubernetes` Service's EndpointSlice points there.
// TLS passes through untouched, so clients still authenticate to the apiserver themselves.
//
// Usage: forward LISTEN_ADDR TARGET_ADDR
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: forward LISTEN_ADDR TARGET_ADDR")
		os.Exit(2)
	}
	listen, target := os.Args[1], os.Args[2]
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Fatalf("forward: %v", err)
	}
	log.Printf("forward: %s -> %s", listen, target)
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		ln.Close()
		os.Exit(0)
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatalf("forward: accept: %v", err)
		}
		go pipe(c, target)
	}
}

func pipe(c net.Conn, target string) {
	defer c.Close()
	t, err := net.Dial("tcp", target)
	if err != nil {
		log.Printf("forward: dial %s: %v", target, err)
		return
	}
	defer t.Close()
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(t, c)
	go cp(c, t)
	<-done
	<-done
}
