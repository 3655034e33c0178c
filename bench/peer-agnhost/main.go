// The real peer (b) of bench/run.sh: the admission webhook of Kubernetes' own end-to-end
// tests (agnhost's `webhook` command, k8s.io/kubernetes/test/images/agnhost/webhook at
// the control plane's version), serving its unmodified `/pods` validator. It has no rate
// rule; bench/peer-go is the stand-in with k8slimiter's rate-rule shape.
//
// agnhost listens on every interface; the benchmark's servers listen on 127.0.0.1 only,
// so overlay/serve_loopback.go is added to the package at build time (go build -overlay,
// see bench/run.sh) with the same handler, TLS config and http.Server on a given address.
package main

import (
	"flag"
	"log"

	"k8s.io/kubernetes/test/images/agnhost/webhook"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8443", "address to serve HTTPS on")
	cert := flag.String("tls-cert", "", "serving certificate (PEM)")
	key := flag.String("tls-key", "", "its private key (PEM)")
	flag.Parse()
	log.Fatal(webhook.ServeLoopback(*listen, *cert, *key))
}
