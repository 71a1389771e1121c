// A webhook receiver that verifies Standard Webhooks signatures (Node 18+, no packages:
// node:crypto only). The npm package "standardwebhooks" verifies in one call,
//   new Webhook(secret).verify(rawBody, headers)
// but also parses the body as JSON, and throws on any other body (the outbox sends
// bytes and text too); verify() here only verifies, and payloadOf() parses JSON bodies.
// Run: WEBHOOK_SECRET=whsec_... node receiver.mjs
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

const seen = new Set(); // use a database table with a unique key in production

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split("/").pop())) {
  createServer((req, res) => {
    const chunks = [];
    req.on("data", (chunk) => chunks.push(chunk));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      try {
        verify(SECRET, body, req.headers);
      } catch {
        res.writeHead(400).end(); // permanent for the outbox: not retried
        return;
      }
      const id = req.headers["webhook-id"]; // the same on every retry of one message
      if (!seen.has(id)) {
        seen.add(id);
        const payload = payloadOf(body, req.headers);
        console.log("received", id, Buffer.isBuffer(payload) ? `${payload.length} bytes` : JSON.stringify(payload));
      }
      res.writeHead(200).end();
    });
  }).listen(8001, "127.0.0.1");
}
