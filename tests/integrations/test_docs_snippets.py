"""The receiver snippets of the documentation (docs/snippets/) verify real requests.

The webhook transport signs a message, a real worker delivers it over loopback, and
the snippet, as the docs show it, must accept it, refuse a forged one, and
deduplicate a repeat by webhook-id. The Node snippet (node:crypto only) is checked the
same way when ``node`` is on PATH.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
import subprocess
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

import outbox
from tests.support import ROOT, hook_settings, serving

SNIPPETS = ROOT / "docs" / "snippets"
SECRET = "whsec_" + base64.b64encode(b"docs-snippet-secret-key-32-bytes").decode()


def load_python_snippet():
    spec = importlib.util.spec_from_file_location("docs_receiver_snippet", SNIPPETS / "receiver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.SECRET = SECRET
    return module


def recording_snippet():
    """The Python snippet, its ``handle`` recording each request's (body, headers) on the
    list returned with it (its own ``handle`` called by it)."""
    snippet = load_python_snippet()
    captured: list[tuple[bytes, dict[str, str]]] = []
    verify = snippet.handle

    def recording_handle(body, headers):
        captured.append((body, headers))
        return verify(body, headers)

    snippet.handle = recording_handle

    return snippet, captured


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    headers = {k: v for k, v in headers.items() if k not in ("content-length", "host", "connection")}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_python_receiver_snippet_verifies_a_request_the_webhook_transport_signed(worker):
    snippet, captured = recording_snippet()
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), snippet.Handler)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/hooks/orders"
        with hook_settings(url, OPTIONS={"secret": SECRET}):
            message = outbox.send("hook", {"order": 42, "total": "12.50"})
            worker()
            assert outbox.get(message.id).status == "succeeded"
        assert snippet.seen_ids == {message.id}
        ((body, headers),) = captured
        assert headers["webhook-id"] == message.id
        # A forged body is refused with a 400 (permanent for the outbox: no retries) ...
        assert post(url, body.replace(b"12.50", b"99.50"), headers) == 400
        # ... and a repeat of the same message (a retry) is acknowledged, not acted on twice.
        assert post(url, body, headers) == 200
        assert snippet.handle(body, headers) == (200, None)
    assert snippet.seen_ids == {message.id}


def test_python_receiver_snippet_checks_the_order_of_an_ordering_key(worker):
    snippet, captured = recording_snippet()
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), snippet.Handler)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/hooks/orders"
        with hook_settings(url, OPTIONS={"secret": SECRET}):
            sent = [
                outbox.send("hook", {"event": e}, ordering_key="order 42")
                for e in ("created", "paid", "shipped")
            ]
            for _ in sent:
                worker()
            assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 3
    assert snippet.last_seq == {"order 42": 3}
    assert [h["outbox-ordering-sequence"] for _, h in captured] == ["1", "2", "3"]
    (body, headers) = captured[1]
    # a retry of "paid" after the receiver processed it (its id forgotten): not acted on twice
    snippet.seen_ids.clear()
    assert snippet.handle(body, headers) == (200, None)
    # "shipped" (previous: 2) to a receiver whose record of the key says 1: refused with a
    # 409 (retried by the outbox), not processed out of order
    snippet.last_seq["order 42"] = 1
    assert snippet.handle(*captured[2]) == (409, None)
    assert snippet.last_seq == {"order 42": 1}
    assert snippet.ordering_of(captured[0][1]) == ("order 42", 1, None)


NOT_JSON = [
    ("plain text, not JSON: {", None),  # str: sent as text/plain; charset=utf-8
    (b"raw,bytes;1\n2\n", "text/csv"),
    (b"\x01\x02 binary-ish but UTF-8 \xc3\xa9", "application/octet-stream"),
]


def test_python_receiver_snippet_accepts_signed_bodies_that_are_not_json(worker):
    """send() takes bytes and str: the documented receiver verifies them (it must not
    parse JSON to verify, or every attempt fails until the message is a dead letter)."""
    snippet = load_python_snippet()
    payloads: dict[str, object] = {}
    handle = snippet.handle

    def recording_handle(body, headers):
        status, payload = handle(body, headers)
        payloads[headers["webhook-id"]] = payload
        return status, payload

    snippet.handle = recording_handle
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), snippet.Handler)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/hooks/orders"
        with hook_settings(url, OPTIONS={"secret": SECRET}):
            sent = [outbox.send("hook", body, content_type=ctype) for body, ctype in NOT_JSON]
            sent.append(outbox.send("hook", {"order": 1}))
            worker()
            assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 4
    expected = [b"plain text, not JSON: {", *(body for body, _ in NOT_JSON[1:]), {"order": 1}]
    assert payloads == {m.id: payload for m, payload in zip(sent, expected, strict=True)}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_receiver_snippet_accepts_signed_bodies_that_are_not_json(receiver, worker):
    with hook_settings(receiver.url, OPTIONS={"secret": SECRET}):
        sent = [outbox.send("hook", body, content_type=ctype) for body, ctype in NOT_JSON]
        sent.append(outbox.send("hook", {"order": 1}))
        worker()
    script = f"""
        import {{ readFileSync }} from "node:fs";
        import {{ verify, payloadOf }} from {json.dumps((SNIPPETS / "receiver.mjs").as_uri())};
        const requests = JSON.parse(readFileSync(0, "utf8"));
        const results = requests.map(([body, headers]) => {{
          const raw = Buffer.from(body, "base64");
          try {{ verify({json.dumps(SECRET)}, raw, headers); }}
          catch (error) {{ return "refused: " + error.message; }}
          const payload = payloadOf(raw, headers);
          return Buffer.isBuffer(payload) ? {{ bytes: payload.toString("base64") }} : payload;
        }});
        console.log(JSON.stringify(results));
    """
    requests = [(base64.b64encode(r.body).decode(), r.headers) for r in receiver.requests]
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    got = dict(
        zip((r.headers["webhook-id"] for r in receiver.requests), json.loads(result.stdout), strict=True)
    )
    expected = [{"bytes": base64.b64encode(m.body).decode()} for m in sent[:3]]
    assert got == {m.id: payload for m, payload in zip(sent, [*expected, {"order": 1}], strict=True)}


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_receiver_snippet_verifies_a_request_the_webhook_transport_signed(receiver, worker):
    with hook_settings(receiver.url, OPTIONS={"secret": SECRET}):
        message = outbox.send("hook", {"order": 7})
        worker()
    (request,) = receiver.requests
    script = f"""
        import {{ readFileSync }} from "node:fs";
        import {{ verify, payloadOf }} from {json.dumps((SNIPPETS / "receiver.mjs").as_uri())};
        const input = JSON.parse(readFileSync(0, "utf8"));
        const results = input.cases.map(([body, secret]) => {{
          const raw = Buffer.from(body, "base64");
          try {{ verify(secret, raw, input.headers); }}
          catch (error) {{ return "refused: " + error.message; }}
          return payloadOf(raw, input.headers);
        }});
        console.log(JSON.stringify(results));
    """
    other_secret = "whsec_" + base64.b64encode(b"another-key-of-thirty-two-bytes!").decode()
    cases = [
        (base64.b64encode(request.body).decode(), SECRET),
        (base64.b64encode(request.body.replace(b"7", b"8")).decode(), SECRET),
        (base64.b64encode(request.body).decode(), other_secret),
    ]
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script],
        input=json.dumps({"headers": request.headers, "cases": cases}),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    accepted, tampered, wrong_key = json.loads(result.stdout)
    assert accepted == {"order": 7}
    assert tampered == "refused: no valid signature"
    assert wrong_key == "refused: no valid signature"
    assert request.headers["webhook-id"] == message.id


def test_settings_reference_documents_every_default_and_nothing_else():
    """The docs' settings page is built from outbox/conf.py's docstring table and DEFAULTS
    (docs/_ext/outbox_settings.py); the build fails when they disagree. Same check here."""
    from outbox import conf

    spec = importlib.util.spec_from_file_location(
        "docs_outbox_settings", SNIPPETS.parent / "_ext" / "outbox_settings.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    documented = module.docstring_entries(conf.__doc__)
    assert set(documented) == set(conf.DEFAULTS)
    assert all(text.strip() for text in documented.values())
    with pytest.raises(ValueError):
        module.docstring_entries("no table here")
