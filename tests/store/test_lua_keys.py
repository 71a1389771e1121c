"""The Lua helper that builds run-time key names (``lua/lib/keys.lua``) against
:class:`outbox.store.keys.Keys`, in a real Redis: the two must never drift apart."""

from importlib import resources

import pytest

from outbox.store.keys import Keys
from outbox.store.scripts import names, source

# Runs K[name](prefix, args...) of lib/keys.lua; an argument "#n" is passed as the Lua
# number n (scripts pass minutes and hours as numbers: math.floor(now / 60)).
CALL = """
local args = {}
for i = 3, #ARGV do
  local v = ARGV[i]
  if string.sub(v, 1, 1) == '#' then v = tonumber(string.sub(v, 2)) end
  args[#args + 1] = v
end
return K[ARGV[1]](ARGV[2], unpack(args))
"""
# The names of every function of lib/keys.lua's table K.
LIST = """
local out = {}
for name in pairs(K) do out[#out + 1] = name end
return out
"""

PREFIXES = ["outbox", "my:app", "zoë"]
DESTINATIONS = ["hook", "zoë", "a:b", "日本", ""]
QUEUES = ["outbox", "high", "q:ë"]
IDS = ["msg_0191a2b3c4d5e6f708192a3b4c5d6e7f", "x:y"]
STATUSES = ["pending", "sending", "succeeded"]

#: Keys method -> argument lists to try (numbers as ints: "#n" in Lua).
CASES: dict[str, list[tuple[object, ...]]] = {
    "message": [(i,) for i in IDS],
    "resend": [(i,) for i in IDS],
    "attempts": [(i,) for i in IDS],
    "status": [(s, d) for s in STATUSES for d in DESTINATIONS],
    "created": [(d,) for d in DESTINATIONS],
    "due": [(q,) for q in QUEUES],
    "quarantine": [(q,) for q in QUEUES],
    "wake": [(q,) for q in QUEUES],
    "idempotency": [(d, k) for d in DESTINATIONS for k in ("k-1", "clé:2", "")],
    "stats": [(o, m) for o in ("succeeded", "parked") for m in (29435295, 0)],
    "dest": [(d,) for d in DESTINATIONS],
    "health": [(d, m) for d in DESTINATIONS for m in (29435295, 7)],
    "errors": [(d, h) for d in DESTINATIONS for h in (490588, 1)],
    "parked": [(d,) for d in DESTINATIONS],
    "gcra": [(d,) for d in DESTINATIONS],
}


def helper() -> str:
    return resources.files("outbox.store").joinpath("lua", "lib", "keys.lua").read_text()


def lua_key(redis, name: str, prefix: str, args: tuple[object, ...]) -> str:
    argv = [f"#{a}" if isinstance(a, int) else a for a in args]
    return redis.eval(helper() + CALL, 0, name, prefix, *argv).decode()


def test_every_lua_key_name_is_the_one_keys_py_builds(redis):
    checked = 0
    for name, cases in CASES.items():
        for prefix in PREFIXES:
            for args in cases:
                expected = getattr(Keys(prefix), name)(*args)
                assert lua_key(redis, name, prefix, args) == expected, (name, prefix, args)
                checked += 1
    assert checked > 100


def test_every_lua_key_function_is_checked(redis):
    """A function added to lib/keys.lua without a case here (or without a Keys method of
    the same name) fails: nothing in Lua builds a name the test does not compare."""
    lua_names = {raw.decode() for raw in redis.eval(helper() + LIST, 0)}
    assert lua_names == set(CASES)
    assert all(callable(getattr(Keys, n, None)) for n in lua_names)


@pytest.mark.parametrize("script", names())
def test_scripts_build_no_key_name_themselves(script):
    """Outside lib/keys.lua no script concatenates a key name: its keys come in KEYS or
    from K (lib/keys.lua)."""
    text = source(script).replace(helper(), "")
    for part in ("prefix ..", "':message:'", "':resend:'", "':status:'", "':due:'", "':dest:'", "':wake:'"):
        assert part not in text, (script, part)
