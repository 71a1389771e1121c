"""The receiver snippets of the documentation (docs/snippets/) verify real requests.

The webhook transport signs a message, a real worker delivers it over loopback, and
the snippet, as the docs show it, must accept it, refuse a forged one, and
deduplicate a repeat by webhook-id. The Node snippet (node:crypto only) is checked the
same way when ``node`` is on PATH.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

import outbox
from tests.support import ROOT, hook_settings, serving, wait_for

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
    epoch = sent[0].order_epoch
    assert epoch and snippet.keys == {"order 42": (epoch, 3)}
    assert [h["outbox-ordering-sequence"] for _, h in captured] == ["1", "2", "3"]
    assert {h["outbox-ordering-epoch"] for _, h in captured} == {epoch}
    assert {h["outbox-ordering-version"] for _, h in captured} == {"2"}
    (body, headers) = captured[1]
    # a retry of "paid" after the receiver processed it (its id forgotten): not acted on twice
    snippet.seen_ids.clear()
    assert snippet.handle(body, headers) == (200, None)
    # "shipped" (previous: 2) to a receiver whose record of the key says 1: refused with a
    # 409 (retried by the outbox), not processed out of order
    snippet.keys["order 42"] = (epoch, 1)
    assert snippet.handle(*captured[2]) == (409, None)
    assert snippet.keys == {"order 42": (epoch, 1)}
    assert snippet.ordering_of(captured[0][1]) == ("order 42", epoch, 1, None, 2)
    # an outbox that sends no epoch (version 1) is checked as before
    old = {
        k: v
        for k, v in captured[2][1].items()
        if k not in ("outbox-ordering-epoch", "outbox-ordering-version")
    }
    snippet.keys["order 42"] = (None, 1)
    assert snippet.handle(captured[2][0], old) == (409, None)
    snippet.keys["order 42"] = (None, 2)
    assert snippet.handle(captured[2][0], old)[0] == 200 and snippet.keys == {"order 42": (None, 3)}
    # a record written before epochs, continued by a message with one: adopted
    snippet.keys["order 42"], snippet.seen_ids = (None, 2), set()
    assert snippet.handle(*captured[2]) == (200, {"event": "shipped"})
    assert snippet.keys == {"order 42": (epoch, 3)}


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


# -- The receivers' ordering protocol (issue 30, item 4) ---------------------------------
#
# Each snippet runs as the docs show it (Python: its Handler; Node: `node receiver.mjs`;
# Go: the built receiver.go), on a loopback port, and a real worker delivers to it. What
# it processed is what it logged ("received <id> ..."); Python's is read from `handle`.

LANGUAGES = [
    "python",
    pytest.param(
        "node", marks=pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
    ),
    pytest.param(
        "go",
        marks=pytest.mark.skipif(
            shutil.which("go") is None,
            reason="go is not installed (Debian: apt-get install golang-go; .ci/run installs it)",
        ),
    ),
]


class SnippetServer:
    """A receiver snippet serving on loopback: ``url``, and ``processed()``: the ids it
    acted on, in order (a message acknowledged without acting is not in it)."""

    def __init__(self, url: str, processed) -> None:
        self.url = url
        self.processed = processed


def _wait_for_port(port: int, process: subprocess.Popen, deadline: float = 60.0) -> None:
    import socket
    import time

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if process.poll() is not None:
            raise AssertionError(f"the snippet exited: {process.stdout.read()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the snippet did not listen")


@contextlib.contextmanager
def snippet_server(language: str, tmp_path):
    from outbox.testing import free_port

    if language == "python":
        snippet = load_python_snippet()
        processed: list[str] = []
        handle = snippet.handle

        def recording_handle(body, headers):
            status, payload = handle(body, headers)
            if payload is not None:
                processed.append(headers["webhook-id"])
            return status, payload

        snippet.handle = recording_handle
        with serving(ThreadingHTTPServer(("127.0.0.1", 0), snippet.Handler)) as server:
            yield SnippetServer(
                f"http://127.0.0.1:{server.server_address[1]}/hooks/orders", lambda: processed
            )
        return
    port = free_port()
    env = {**os.environ, "WEBHOOK_SECRET": SECRET, "PORT": str(port)}
    if language == "node":
        command = ["node", str(SNIPPETS / "receiver.mjs")]
    else:
        shutil.copy(SNIPPETS / "receiver.go", tmp_path / "receiver.go")
        build_env = {**env, "GOCACHE": str(tmp_path / "gocache"), "GO111MODULE": "off"}
        subprocess.run(
            ["go", "build", "-o", str(tmp_path / "receiver"), "receiver.go"],
            cwd=tmp_path,
            env=build_env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        command = [str(tmp_path / "receiver")]
    log = tmp_path / f"{language}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        with open(log) as reader:
            process.stdout = reader
            _wait_for_port(port, process)

        def processed() -> list[str]:
            return [line.split()[1] for line in log.read_text().splitlines() if line.startswith("received ")]

        yield SnippetServer(f"http://127.0.0.1:{port}/hooks/orders", processed)
    finally:
        process.terminate()
        process.wait(timeout=10)


def ordered_hook(url: str):
    return hook_settings(url, OPTIONS={"secret": SECRET}, MAX_RETRIES=3, BREAKER=False, RETRY=[0.05] * 3)


def signed(body: bytes, headers: dict[str, str], message_id: str) -> dict[str, str]:
    """``headers`` with a fresh Standard Webhooks signature of ``body`` as ``message_id``."""
    from datetime import datetime, timezone

    from standardwebhooks import Webhook

    now = datetime.now(tz=timezone.utc)
    return {
        **headers,
        "content-type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(message_id, now, body.decode()),
    }


@pytest.mark.parametrize("language", LANGUAGES)
def test_receiver_snippet_acts_on_a_key_restarted_after_its_state_expired(
    language, worker, repo, settings, tmp_path
):
    """Issue 30, item 4 (a): a key's state expires ORDERING_KEY_TTL after the key empties,
    and its next message starts again at sequence 1. The receiver must act on it (it
    answered 200 to "seq <= last" and dropped it: `succeeded`, nothing processed)."""
    settings.OUTBOX = {**settings.OUTBOX, "ORDERING_KEY_TTL": 1}

    with snippet_server(language, tmp_path) as server, ordered_hook(server.url):
        first = outbox.send("hook", {"n": 1}, ordering_key="order 42")
        second = outbox.send("hook", {"n": 2}, ordering_key="order 42")
        worker()
        worker()
        state = repo.order_keys("hook", "order 42").order_state("hook", "order 42")
        assert wait_for(lambda: not repo.connection.exists(state), timeout=10)
        restarted = outbox.send("hook", {"n": 3}, ordering_key="order 42")
        assert (restarted.order_seq, restarted.order_prev) == (1, None)
        assert restarted.order_epoch != first.order_epoch == second.order_epoch
        worker()
        sent = [first, second, restarted]
        assert [outbox.get(m.id).status for m in sent] == ["succeeded"] * 3
        assert server.processed() == [m.id for m in sent]
        # a repeat of the restarted key's message is acknowledged, not acted on twice
        again = outbox.get(restarted.id)
        headers = {
            "outbox-ordering-key": "order%2042",
            "outbox-ordering-sequence": "1",
            "outbox-ordering-epoch": again.order_epoch,
            "outbox-ordering-version": "2",
        }
        assert post(server.url, b'{"n": 3}', signed(b'{"n": 3}', headers, restarted.id)) == 200
        assert server.processed() == [m.id for m in sent]


@pytest.mark.parametrize("language", LANGUAGES)
def test_receiver_snippet_moves_on_after_a_delivered_message_is_requeued(language, worker, tmp_path):
    """Issue 30, item 4 (b): requeueing a delivered message sends its id again with a
    new sequence. The receiver acknowledges it without acting twice AND takes its new
    sequence as the last one (it kept the old one, so the key's next message got a 409
    on every attempt and ended a blocked dead letter)."""
    with snippet_server(language, tmp_path) as server, ordered_hook(server.url):
        first = outbox.send("hook", {"n": 1}, ordering_key="order 7")
        worker()
        assert outbox.requeue(first.id).acted == 1
        assert outbox.get(first.id).order_seq == 2
        worker()
        second = outbox.send("hook", {"n": 2}, ordering_key="order 7")
        assert second.order_seq == 3
        worker()
        assert [outbox.get(m.id).status for m in (first, second)] == ["succeeded"] * 2
        assert outbox.get(second.id).last_status_code == 200
        assert server.processed() == [first.id, second.id]
        # a message whose previous one this receiver did not process: refused with a 409
        # (retried by the outbox), not processed out of order
        epoch = outbox.get(second.id).order_epoch
        gap = {
            "outbox-ordering-key": "order%207",
            "outbox-ordering-sequence": "5",
            "outbox-ordering-previous": "4",
            "outbox-ordering-epoch": epoch,
            "outbox-ordering-version": "2",
        }
        assert post(server.url, b'{"n": 5}', signed(b'{"n": 5}', gap, "msg_gap")) == 409
        # a version of the protocol it does not know: refused with a 409 too
        newer = {**gap, "outbox-ordering-sequence": "4", "outbox-ordering-previous": "3"}
        newer["outbox-ordering-version"] = "3"
        assert post(server.url, b'{"n": 4}', signed(b'{"n": 4}', newer, "msg_newer")) == 409
        assert server.processed() == [first.id, second.id]
