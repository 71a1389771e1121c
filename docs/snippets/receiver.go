// A webhook receiver that verifies Standard Webhooks signatures (Go), with the
// specification's own library:
//
//	go get github.com/standard-webhooks/standard-webhooks/libraries/go
package main

import (
	"encoding/json"
	"io"
	"log"
	"mime"
	"net/http"
	"os"
	"strings"
	"sync"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

func main() {
	wh, err := standardwebhooks.NewWebhook(os.Getenv("WEBHOOK_SECRET")) // "whsec_..."
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]bool{} // use a database table with a unique key in production

	http.HandleFunc("/hooks/orders", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		// Checks webhook-signature over "webhook-id.webhook-timestamp.body" and the
		// timestamp's age (5 minutes).
		if err := wh.Verify(body, r.Header); err != nil {
			w.WriteHeader(http.StatusBadRequest) // permanent for the outbox: not retried
			return
		}
		id := r.Header.Get("webhook-id") // the same on every retry of one message
		mu.Lock()
		duplicate := seen[id]
		seen[id] = true
		mu.Unlock()
		if !duplicate {
			// Verify only checked the signature: the body may be any bytes (the outbox
			// sends text and bytes too). Decode it only when it says it is JSON.
			mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if mediaType == "application/json" || strings.HasSuffix(mediaType, "+json") {
				var payload any
				if err := json.Unmarshal(body, &payload); err != nil {
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				log.Printf("received %s %v", id, payload)
			} else {
				log.Printf("received %s: %d bytes of %s", id, len(body), mediaType)
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8001", nil))
}
