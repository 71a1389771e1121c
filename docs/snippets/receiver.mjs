// A webhook receiver that verifies Standard Webhooks signatures (Node 18+, no packages:
// node:crypto only). The npm package "standardwebhooks" verifies in one call,
//   new Webhook(secret).verify(rawBody, headers)
// but also parses the body as JSON, and throws on any other body (the outbox sends
// bytes and text too); verify() here only verifies, and payloadOf() parses JSON bodies.
// Run: WEBHOOK_SECRET=whsec_... PORT=8001 node receiver.mjs
import { createHmac, timingSafeEqual } from "node:crypto";
import { createServer } from "node:http";

const SECRET = process.env.WEBHOOK_SECRET ?? "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const TOLERANCE_SECONDS = 5 * 60;

// Throws when the request is not signed with `secret` (or its timestamp is too far off).
// The body is not parsed: it may be any bytes.
export function verify(secret, rawBody, headers) {
  const id = headers["webhook-id"];
  const timestamp = headers["webhook-timestamp"];
  const signatures = headers["webhook-signature"];
  if (!id || !timestamp || !signatures) throw new Error("missing webhook headers");
  if (Math.abs(Date.now() / 1000 - Number(timestamp)) > TOLERANCE_SECONDS) {
    throw new Error("timestamp outside the tolerance (a replay?)");
  }
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const expected = createHmac("sha256", key)
    .update(`${id}.${timestamp}.`)
    .update(rawBody)
    .digest();
  // "v1,<base64> v1,<base64>": one signature per secret while keys rotate.
  const ok = signatures.split(" ").some((entry) => {
    const [version, value] = entry.split(",", 2);
    const given = Buffer.from(value ?? "", "base64");
    return version === "v1" && given.length === expected.length && timingSafeEqual(given, expected);
  });
  if (!ok) throw new Error("no valid signature");
}

// The parsed JSON for a JSON content type (application/json, or ...+json), else the raw bytes.
export function payloadOf(rawBody, headers) {
  const mediaType = (headers["content-type"] ?? "").split(";")[0].trim().toLowerCase();
  const json = mediaType === "application/json" || mediaType.endsWith("+json");
  return json ? JSON.parse(rawBody.toString("utf8")) : rawBody;
}

export const KNOWN_VERSION = 2; // the Outbox-Ordering-Version this receiver implements

// { key, epoch, seq, previous, version } of an ordered message, else null. The epoch is
// the key's generation at the outbox (opaque: compare for equality only): a key whose
// state expired starts again at sequence 1 in a new epoch. No version header: version 1
// (a message that joined its key before the outbox sent epochs: no epoch either).
export function orderingOf(headers) {
  if (!headers["outbox-ordering-key"]) return null;
  const previous = headers["outbox-ordering-previous"];
  return {
    key: decodeURIComponent(headers["outbox-ordering-key"]),
    epoch: headers["outbox-ordering-epoch"] || null,
    seq: Number(headers["outbox-ordering-sequence"]),
    previous: previous ? Number(previous) : null,
    version: Number(headers["outbox-ordering-version"] || 1),
  };
}

// "process", "duplicate" (acknowledge, do not act) or "retry" (answer 409) for an ordered
// message, given this receiver's record of its key: { epoch, last } or undefined.
export function checkOrder(order, record) {
  if (order.version > KNOWN_VERSION) return "retry"; // headers it may misread: wait for an upgrade
  if (!record) return "process"; // the first message of the key this receiver sees
  if (order.epoch !== null && order.epoch !== record.epoch) {
    // A record from before epochs that this message continues: the same life of the key.
    // Otherwise the key restarted: its first message has no previous (one: we missed some).
    if (!(record.epoch === null && order.previous === record.last)) {
      return order.previous !== null ? "retry" : "process";
    }
  }
  if (order.seq <= record.last) return "duplicate"; // processed before: do nothing twice
  // The outbox delivered `previous`, this receiver did not process it: it is behind.
  if (order.previous !== null && order.previous !== record.last) return "retry";
  return "process";
}

// Keep these in your database, written in the same transaction as what you do with the
// payload (a table with a unique key for the ids, one row per ordering key).
const seen = new Set(); // ids processed
const keys = new Map(); // ordering key -> { epoch, last } (last sequence processed)

// [HTTP status, payload or undefined when not acted on] for a request.
export function handle(secret, body, headers) {
  try {
    verify(secret, body, headers);
  } catch {
    return [400]; // permanent for the outbox: not retried
  }
  const id = headers["webhook-id"]; // the same on every retry of one message
  const order = orderingOf(headers);
  if (order) {
    const verdict = checkOrder(order, keys.get(order.key));
    if (verdict === "retry") return [409]; // retried by the outbox: the key waits
    if (verdict === "duplicate") return [200];
    if (seen.has(id)) {
      // A requeue of a message processed before: the same id with a new sequence. Do
      // nothing twice, but take its sequence as the last one (or the next would be 409).
      keys.set(order.key, { epoch: order.epoch, last: order.seq });
      return [200];
    }
  } else if (seen.has(id)) {
    return [200]; // delivered before: do nothing twice
  }
  let payload;
  try {
    payload = payloadOf(body, headers);
  } catch {
    return [400]; // a JSON content type, but not JSON: permanent
  }
  // ... act on the payload, then record it (in the same database transaction) ...
  seen.add(id);
  if (order) keys.set(order.key, { epoch: order.epoch, last: order.seq });
  return [200, payload];
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split("/").pop())) {
  createServer((req, res) => {
    const chunks = [];
    req.on("data", (chunk) => chunks.push(chunk));
    req.on("end", () => {
      const [status, payload] = handle(SECRET, Buffer.concat(chunks), req.headers);
      if (payload !== undefined) {
        const id = req.headers["webhook-id"];
        console.log("received", id, Buffer.isBuffer(payload) ? `${payload.length} bytes` : JSON.stringify(payload));
      }
      res.writeHead(status).end();
    });
  }).listen(Number(process.env.PORT ?? 8001), "127.0.0.1");
}
