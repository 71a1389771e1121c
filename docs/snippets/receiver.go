// A webhook receiver that verifies Standard Webhooks signatures (Go, standard library
// only: crypto/hmac). The specification's library verifies in one call,
//
//	go get github.com/standard-webhooks/standard-webhooks/libraries/go
//	wh, _ := standardwebhooks.NewWebhook(secret); err := wh.Verify(body, r.Header)
//
// verify() below does the same. Run: WEBHOOK_SECRET=whsec_... PORT=8001 go run receiver.go
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

const knownVersion = 2 // the Outbox-Ordering-Version this receiver implements

// verify checks webhook-signature (HMAC-SHA256 over "id.timestamp.body", one
// "v1,<base64>" per secret while keys rotate) and the timestamp's age (5 minutes).
func verify(secret string, body []byte, h http.Header) error {
	id, ts, sigs := h.Get("webhook-id"), h.Get("webhook-timestamp"), h.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook headers")
	}
	seconds, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || math.Abs(float64(time.Now().Unix()-seconds)) > 5*60 {
		return errors.New("timestamp outside the tolerance (a replay?)")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	expected := mac.Sum(nil)
	for _, entry := range strings.Split(sigs, " ") {
		version, value, _ := strings.Cut(entry, ",")
		given, err := base64.StdEncoding.DecodeString(value)
		if version == "v1" && err == nil && hmac.Equal(given, expected) {
			return nil
		}
	}
	return errors.New("no valid signature")
}

// order is an ordered message's headers. Epoch: the key's generation at the outbox
// (opaque: compare for equality only); a key whose state expired starts again at
// sequence 1 in a new epoch. No version header: version 1 (no epoch either).
type order struct {
	key, epoch    string
	seq, previous int64 // previous: 0 when absent (none delivered before it)
	version       int64
}

// record is what a receiver keeps per ordering key: the epoch and the last sequence processed.
type record struct {
	epoch string
	last  int64
}

func orderingOf(h http.Header) (*order, error) {
	if h.Get("outbox-ordering-key") == "" {
		return nil, nil
	}
	key, err := url.PathUnescape(h.Get("outbox-ordering-key"))
	if err != nil {
		return nil, err
	}
	o := &order{key: key, epoch: h.Get("outbox-ordering-epoch"), version: 1}
	if o.seq, err = strconv.ParseInt(h.Get("outbox-ordering-sequence"), 10, 64); err != nil {
		return nil, err
	}
	if p := h.Get("outbox-ordering-previous"); p != "" {
		if o.previous, err = strconv.ParseInt(p, 10, 64); err != nil {
			return nil, err
		}
	}
	if v := h.Get("outbox-ordering-version"); v != "" {
		if o.version, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// checkOrder returns "process", "duplicate" (acknowledge, do not act) or "retry"
// (answer 409) for an ordered message, given this receiver's record of its key (nil: none).
func checkOrder(o *order, r *record) string {
	if o.version > knownVersion {
		return "retry" // headers it may misread: wait for an upgrade
	}
	if r == nil {
		return "process" // the first message of the key this receiver sees
	}
	if o.epoch != "" && o.epoch != r.epoch {
		// A record from before epochs that this message continues: the same life of the
		// key. Otherwise the key restarted: its first message has no previous.
		if !(r.epoch == "" && o.previous == r.last) {
			if o.previous != 0 {
				return "retry" // we missed the start of this epoch
			}
			return "process"
		}
	}
	if o.seq <= r.last {
		return "duplicate" // processed before: do nothing twice
	}
	if o.previous != 0 && o.previous != r.last {
		return "retry" // the outbox delivered `previous`, we did not process it
	}
	return "process"
}

func main() {
	secret := os.Getenv("WEBHOOK_SECRET") // "whsec_..."
	port := os.Getenv("PORT")
	if port == "" {
		port = "8001"
	}
	log.SetFlags(0)
	log.SetOutput(os.Stdout)
	var mu sync.Mutex
	// Keep these in your database, written in the same transaction as what you do with
	// the payload (a table with a unique key for the ids, one row per ordering key).
	seen := map[string]bool{}    // ids processed
	keys := map[string]*record{} // ordering key -> (epoch, last sequence processed)

	http.HandleFunc("/hooks/orders", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if err := verify(secret, body, r.Header); err != nil {
			w.WriteHeader(http.StatusBadRequest) // permanent for the outbox: not retried
			return
		}
		id := r.Header.Get("webhook-id") // the same on every retry of one message
		o, err := orderingOf(r.Header)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock() // one request at a time here; a database transaction in production
		defer mu.Unlock()
		if o != nil {
			switch checkOrder(o, keys[o.key]) {
			case "retry":
				w.WriteHeader(http.StatusConflict) // retried by the outbox: the key waits
				return
			case "duplicate":
				w.WriteHeader(http.StatusOK)
				return
			}
			if seen[id] {
				// A requeue of a message processed before: the same id with a new sequence.
				// Do nothing twice, but take its sequence as the last one.
				keys[o.key] = &record{o.epoch, o.seq}
				w.WriteHeader(http.StatusOK)
				return
			}
		} else if seen[id] {
			w.WriteHeader(http.StatusOK) // delivered before: do nothing twice
			return
		}
		// verify only checked the signature: the body may be any bytes (the outbox sends
		// text and bytes too). Decode it only when it says it is JSON.
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
		// ... act on the payload, then record it (in the same database transaction) ...
		seen[id] = true
		if o != nil {
			keys[o.key] = &record{o.epoch, o.seq}
		}
		w.WriteHeader(http.StatusOK)
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:"+port, nil))
}
