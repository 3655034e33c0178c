// peer-go: a minimal Go rate-limiting admission webhook, the stand-in peer for the
// server benchmarks (bench/run.sh). It is NOT k8slimiter: github.com/arturhoo/k8slimiter
// is not served by the Go module proxy (403 "This module version is not available"), so
// this program is written in its shape: net/http with ListenAndServeTLS (h2 and
// HTTP/1.1), the review decoded into k8s.io/api admission/v1 types, the pod decoded into
// core/v1, and one golang.org/x/time/rate token bucket per rule. Unlike k8slimiter it
// does not log every request, which only makes it faster.
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"

	"golang.org/x/time/rate"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8446", "HTTPS address")
	cert := flag.String("tls-cert", "tls.crt", "PEM certificate")
	key := flag.String("tls-key", "tls.key", "PEM key")
	perSec := flag.Float64("rate", 2, "pod events per second (token bucket refill)")
	burst := flag.Int("burst", 20, "token bucket size")
	flag.Parse()

	limiter := rate.NewLimiter(rate.Limit(*perSec), *burst)
	http.HandleFunc("/validate", func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		req := review.Request
		raw := req.Object.Raw
		if req.Operation == admissionv1.Delete {
			raw = req.OldObject.Raw
		}
		var pod corev1.Pod
		if err := json.Unmarshal(raw, &pod); err != nil {
			http.Error(w, "cannot decode the pod: "+err.Error(), http.StatusBadRequest)
			return
		}
		response := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
		if req.Kind.Kind == "Pod" && !limiter.Allow() {
			response.Allowed = false
			response.Result = &metav1.Status{
				Status:  metav1.StatusFailure,
				Message: "rate limit exceeded",
				Reason:  metav1.StatusReasonTooManyRequests,
				Code:    http.StatusTooManyRequests,
			}
		}
		review.Request = nil
		review.Response = response
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(&review); err != nil {
			log.Printf("encode: %v", err)
		}
	})
	log.Printf("peer-go listening on https://%s (rate %.6g/s, burst %d)", *listen, *perSec, *burst)
	log.Fatal(http.ListenAndServeTLS(*listen, *cert, *key, nil))
}
