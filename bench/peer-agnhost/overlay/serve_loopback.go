// Added to k8s.io/kubernetes/test/images/agnhost/webhook at build time by bench/run.sh
// (go build -overlay): agnhost's own `/pods` handler and TLS config, served on the
// address given instead of every interface. Nothing of the package is changed.
package webhook

import "net/http"

// ServeLoopback serves agnhost's pod validator on addr until the listener fails.
func ServeLoopback(addr, certFile, keyFile string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/pods", servePods)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	server := &http.Server{
		Addr:      addr,
		Handler:   mux,
		TLSConfig: configTLS(Config{CertFile: certFile, KeyFile: keyFile}),
	}
	return server.ListenAndServeTLS("", "")
}
