// coredns is CoreDNS built with only the plugins the node's cluster DNS uses, as CoreDNS
// documents for a custom build ("plugin.cfg" order becomes dnsserver.Directives). There is no
// forward plugin: names outside the cluster domain are not resolved, so no query leaves the
// machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

// The order plugins run in, a subset of CoreDNS's plugin.cfg in its order.
var directives = []string{
	"reload",
	"health",
	"ready",
	"errors",
	"log",
	"cache",
	"loadbalance",
	"kubernetes",
	"whoami",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
