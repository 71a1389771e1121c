"""What each write of ``lua/create.lua`` costs Redis (issue 30, item 10): one ``send()``'s
message (captured from a real ``send()``, which calls ``lua/create_one.lua``), replayed
against a private Redis through ``create_one.lua`` and through ``create.lua`` with copies
of it that leave one write out each, interleaved round by round; ``INFO commandstats``
``usec_per_call`` of ``EVALSHA`` for each.

    .venv/bin/python -m benchmarks.create_cost [--calls 2000] [--rounds 5]

Each call gets a fresh message id (its records' keys and ARGV), as ``send()`` does. The
wake-up flag is set by the first call and refused (``SET NX``) by the others while it
lives, as between two worker wake-ups of a busy queue.
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from benchmarks.common import body_200, private_redis, setup_django

# (name, text to replace in create.lua, replacement): each removes one write
VARIANTS = [
    ("full", None, None),
    (
        "no SET NX record",
        "if redis.call('SET', m.mkey, m.record, 'NX') then",
        "if true then",
    ),
    (
        "no HSET resend",
        "redis.call('HSET', m.rkey, 'status', status, 'destination', dest, 'queue', queue,\n"
        "      'next_attempt_at', score, 'updated_at', m.created, unpack(ARGV, m.rfirst, m.rlast))",
        "local _ = m.rkey",
    ),
    ("no ZADD status", "zadd_once(skey, score, id)", "local _ = skey"),
    ("no ZADD due", "if due then zadd_once(m.dkey, score, id) end", "local _ = due"),
    ("no ZADD created", "zadd_once(m.ckey, m.created, id)", "local _ = m.ckey"),
    (
        "no wake SET NX PX",
        "if due and tonumber(score) <= due_by then wake_queue(m.wkey, queue, now_s, wake_ttl) end",
        "",
    ),
    (
        "return after the libraries",
        "local idem_ttl = tonumber(ARGV[1])",
        "do return {0} end\nlocal idem_ttl = tonumber(ARGV[1])",
    ),
    ("return after the first pass", "local guarded = nil", "do return {0} end\nlocal guarded = nil"),
    ("Lua alone (redis.call a no-op)", None, "local redis = {call = function() return 1 end}"),
    ("empty (same KEYS, ARGV)", None, "do return {0} end"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help="variant names, separated by ;")
    opts = parser.parse_args()
    server = private_redis()
    try:
        setup_django()
        import outbox
        from outbox.store import creating, get_repository
        from outbox.store.client.connection import get_connection
        from outbox.store.scripts import source

        captured: list = []
        real = creating.evalsha

        def spy(name, args, keys):
            captured.append((name, list(args), list(keys)))
            return real(name, args, keys)

        creating.evalsha = spy
        body = body_200()
        outbox.send("noop", body)
        outbox.send("noop", body)  # the second: as every send() after its process's first
        creating.evalsha = real
        name, one_args, one_keys = captured[-1]
        assert name == "create_one", name
        mid = str(one_args[3])  # the message's id (CREATE_ONE: status, dest, queue, id)
        repo = get_repository()
        message = repo.get(mid)
        # the same message as lua/create.lua takes it (every call but a plain send()'s)
        args = repo.create_args([message], float(one_args[7]), 0.5, False)
        keys = [*repo.create_keys([message]), repo.keys.destinations]
        conn = get_connection()
        text = source("create")
        calls = {
            "create_one.lua (send()'s script)": (conn.script_load(source("create_one")), one_args, one_keys)
        }
        for name, old, new in VARIANTS:
            if opts.only and name not in opts.only.split(";"):
                continue
            if old is None and new is None:
                body_text = text
            elif old is None:
                body_text = new + "\n" + text
            else:
                assert old in text, name
                body_text = text.replace(old, new)
            calls[name] = (conn.script_load(body_text), args, keys)
        shas = {name: sha for name, (sha, _, _) in calls.items()}
        per: dict[str, list[float]] = {name: [] for name in shas}
        inner: dict[str, list[float]] = {}
        for _ in range(opts.rounds):
            for name, sha in shas.items():
                conn.flushdb()
                conn.config_resetstat()
                _, args_of, keys_of = calls[name]
                for _ in range(opts.calls):
                    new_id = str(uuid.uuid4())
                    k = [x.replace(mid, new_id) for x in keys_of]
                    a = [new_id if str(x) == mid else x for x in args_of]
                    conn.evalsha(sha, len(k), *k, *a)
                stats = conn.info("commandstats")
                per[name].append(stats["cmdstat_evalsha"]["usec_per_call"])
                if name == "full":
                    for cmd, st in stats.items():
                        if cmd != "cmdstat_evalsha" and st["calls"] >= opts.calls:
                            inner.setdefault(cmd[8:], []).append(st["usec_per_call"])
        full = statistics.median(per["full"]) if "full" in per else None
        print(
            f"create.lua: {len(keys)} KEYS, {len(args)} ARGV; create_one.lua: {len(one_keys)} KEYS, "
            f"{len(one_args)} ARGV; µs per call (median of {opts.rounds} rounds, min-max)"
        )
        for name, values in per.items():
            m = statistics.median(values)
            delta = f"  {m - full:+.2f}" if full is not None else ""
            print(f"{name:28s} {m:6.2f} ({min(values):.2f}-{max(values):.2f}){delta}")
        print("inside the full script, each command's own µs per call (commandstats):")
        for cmd, values in inner.items():
            print(f"  {cmd:26s} {statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
