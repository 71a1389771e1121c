"""The Lua helper that builds run-time key names (``lua/lib/keys.lua``) against
:class:`outbox.store.keys.Keys`, in a real Redis: the two must never drift apart."""

from importlib import resources

import pytest
from redis.crc import key_slot

from outbox.store.keys import Keys
from outbox.store.scripts import names, source

# Runs K[name](prefix, args...) of lib/keys.lua with K.parts = ARGV[1]; ARGV[2] is the
# function's name, ARGV[3] the prefix; when ARGV[4] is not "", the prefix is first made a
# partition's (K.partition(prefix, ARGV[4])): the index functions take a partition's prefix.
# An argument "#n" is passed as the Lua number n (scripts pass minutes and hours as
# numbers: math.floor(now / 60)).
CALL = """
K.parts = tonumber(ARGV[1])
local prefix = ARGV[3]
if ARGV[4] ~= '' then prefix = K.partition(prefix, tonumber(ARGV[4])) end
local args = {}
for i = 5, #ARGV do
  local v = ARGV[i]
  if string.sub(v, 1, 1) == '#' then v = tonumber(string.sub(v, 2)) end
  args[#args + 1] = v
end
return K[ARGV[2]](prefix, unpack(args))
"""
# The names of every function of lib/keys.lua's table K.
LIST = """
local out = {}
for name, value in pairs(K) do
  if type(value) == 'function' then out[#out + 1] = name end
end
return out
"""

PREFIXES = ["outbox", "my:app", "zoë"]
DESTINATIONS = ["hook", "zoë", "a:b", "日本", "", "x}{y"]
QUEUES = ["outbox", "high", "q:ë"]
IDS = ["msg_0191a2b3c4d5e6f708192a3b4c5d6e7f", "x:y", "msg_0191a2b3c4d5e6f708192a3b4c5d6e7f_p7"]
STATUSES = ["pending", "sending", "succeeded"]
PARTITION_COUNTS = [1, 16]

#: Keys method -> argument lists to try (numbers as ints: "#n" in Lua).
#: A message's records: from its id.
BY_ID: dict[str, list[tuple[object, ...]]] = {
    "message": [(i,) for i in IDS],
    "resend": [(i,) for i in IDS],
    "attempts": [(i,) for i in IDS],
}
#: A partition's indexes: on Keys.partition(k), in Lua from K.partition(prefix, k).
BY_PARTITION: dict[str, list[tuple[object, ...]]] = {
    "status": [(s, d) for s in STATUSES for d in DESTINATIONS],
    "created": [(d,) for d in DESTINATIONS],
    "due": [(q,) for q in QUEUES],
    "quarantine": [(q,) for q in QUEUES],
    "idempotency": [(d, k) for d in DESTINATIONS for k in ("k-1", "clé:2", "")],
    "stats": [(o, m) for o in ("succeeded", "parked") for m in (29435295, 0)],
    "parked": [(d,) for d in DESTINATIONS],
    "order": [(d, k) for d in DESTINATIONS for k in ("order-42", "clé:2")],
    "order_state": [(d, k) for d in DESTINATIONS for k in ("order-42", "clé:2")],
    "order_log": [(d, k) for d in DESTINATIONS for k in ("order-42", "clé:2")],
    "blocked": [(d,) for d in DESTINATIONS],
    "payload": [("evt_6bq3ypm5x2f4lk3c7d2zq5w6ya",), ("x:y",)],
}
#: A destination's state and the keys across the deployment.
SHARED: dict[str, list[tuple[object, ...]]] = {
    "wake": [(q,) for q in QUEUES],
    "dest": [(d,) for d in DESTINATIONS],
    "health": [(d, m) for d in DESTINATIONS for m in (29435295, 7)],
    "errors": [(d, h) for d in DESTINATIONS for h in (490588, 1)],
    "gcra": [(d,) for d in DESTINATIONS],
    "inflight": [(d,) for d in DESTINATIONS],
    "counted": [(d, r) for d in DESTINATIONS for r in ("0f3a9c1d2b4e5f60", "r")],
    "counted_run": [(r,) for r in ("0f3a9c1d2b4e5f60", "r")],
}
#: Names that are not keys but that both sides build: (Lua name, arguments), no prefix.
MEMBERS: dict[str, list[tuple[str, ...]]] = {
    "inflight_member": [(lease, i) for lease in ("0f3a9c1d2b4e5f60", "") for i in IDS],
}
#: Prefix helpers, checked against Keys by the tests below: (Lua name, Python function).
PREFIX_HELPERS = {
    "part": lambda keys, id_: keys.tag_prefix(int(id_.rpartition("_p")[2]) if "_p" in id_ else 0),
    "partition": lambda keys, k: keys.tag_prefix(k),
    "home": lambda keys, d: keys.home(d),
    "shared": lambda keys: keys.shared,
    "setup": None,  # reads a script's arguments: used by every script, checked by their tests
}


def helper() -> str:
    return resources.files("outbox.store").joinpath("lua", "lib", "keys.lua").read_text()


def lua_key(
    redis, parts: int, name: str, prefix: str, args: tuple[object, ...], partition: int | None = None
) -> str:
    argv = [f"#{a}" if isinstance(a, int) else a for a in args]
    part = "" if partition is None else str(partition)
    return redis.eval(helper() + CALL, 0, parts, name, prefix, part, *argv).decode()


def test_every_lua_key_name_is_the_one_keys_py_builds(redis):
    checked = 0
    for parts in PARTITION_COUNTS:
        for prefix in PREFIXES:
            keys = Keys(prefix, parts)
            for name, cases in {**BY_ID, **SHARED}.items():
                for args in cases:
                    expected = getattr(keys, name)(*args)
                    assert lua_key(redis, parts, name, prefix, args) == expected, (parts, name, prefix, args)
                    checked += 1
            for name, cases in BY_PARTITION.items():
                for k in {0, parts - 1}:
                    for args in cases:
                        expected = getattr(keys.partition(k), name)(*args)
                        assert lua_key(redis, parts, name, prefix, args, k) == expected, (
                            parts,
                            name,
                            k,
                            args,
                        )
                        checked += 1
    assert checked > 500


def test_partitioned_names_share_one_hash_slot_per_partition_and_destination():
    """With more than one partition, a message's records and its partition's indexes hash
    to one slot, a destination's state to its own (redis-py's key_slot: CRC16 of the hash
    tag, as a cluster computes it)."""
    keys = Keys("outbox", 16)
    mid = "msg_0191a2b3c4d5e6f708192a3b4c5d6e7f_p7"
    part = keys.of(mid)
    same = [
        keys.message(mid),
        keys.resend(mid),
        keys.attempts(mid),
        part.status("pending", "hook"),
        part.due("outbox"),
        part.created("hook"),
        part.parked("hook"),
        part.idempotency("hook", "k"),
    ]
    slots = {key_slot(k.encode()) for k in same}
    assert len(slots) == 1
    home = [keys.dest("a}b"), keys.gcra("a}b"), keys.health("a}b", 7), keys.errors("a}b", 1)]
    assert len({key_slot(k.encode()) for k in home}) == 1
    shared = [keys.destinations, keys.probes, keys.wake("outbox"), keys.lock("recovery"), keys.workers]
    assert len({key_slot(k.encode()) for k in shared}) == 1
    # one partition: no tag, the names of before partitions
    assert (
        Keys("outbox").message(mid.removesuffix("_p7"))
        == "outbox:message:msg_0191a2b3c4d5e6f708192a3b4c5d6e7f"
    )
    assert Keys("outbox").due("outbox") == "outbox:due:outbox"


def test_prefix_helpers_match_keys_py(redis):
    for parts in PARTITION_COUNTS:
        keys = Keys("outbox", parts)
        for id_ in IDS:
            want = PREFIX_HELPERS["part"](keys, id_) if parts > 1 else "outbox"
            assert lua_key(redis, parts, "part", "outbox", (id_,)) == want
        assert lua_key(redis, parts, "partition", "outbox", (parts - 1,)) == keys.tag_prefix(parts - 1)
        assert lua_key(redis, parts, "home", "outbox", ("hook",)) == keys.home("hook")
        assert lua_key(redis, parts, "shared", "outbox", ()) == keys.shared


def test_every_lua_key_function_is_checked(redis):
    """A function added to lib/keys.lua without a case here (or without a Keys method of
    the same name) fails: nothing in Lua builds a name the test does not compare."""
    lua_names = {raw.decode() for raw in redis.eval(helper() + LIST, 0)}
    assert lua_names == {*BY_ID, *BY_PARTITION, *SHARED, *PREFIX_HELPERS, *MEMBERS}
    assert all(callable(getattr(Keys, n, None)) for n in {*BY_ID, *BY_PARTITION, *SHARED, *MEMBERS})


def test_every_member_both_sides_build_is_the_same(redis):
    for name, cases in MEMBERS.items():
        for args in cases:
            got = redis.eval(helper() + f"return K.{name}(unpack(ARGV))", 0, *args).decode()
            assert got == getattr(Keys, name)(*args), (name, args)


@pytest.mark.parametrize("script", names())
def test_scripts_build_no_key_name_themselves(script):
    """Outside lib/keys.lua no script concatenates a key name: its keys come in KEYS or
    from K (lib/keys.lua)."""
    text = source(script).replace(helper(), "")
    for part in ("prefix ..", "':message:'", "':resend:'", "':status:'", "':due:'", "':dest:'", "':wake:'"):
        assert part not in text, (script, part)
