"""Slot store on Redis (distributed mode): each operation is one Lua script, so it is atomic on the server.

Keys (under `key_prefix` + "slots:"):
- `s:{scope}`  ZSET per scope, member = lease token "{fence}:{holder}", score = expiry in ms (server time)
- `fence`      the fence counter (INCR; only grows; re-created from a database floor if lost)
- `scopes`     SET of scope names ever used, so counts() and rebuild() can find every ZSET
- `backed`     SET of tokens the database has vouched for (see base.py / rebuild)

Time is Redis's own clock (`TIME` inside the scripts), so client clock skew between schedulers cannot make
one of them see a lease as expired early. Every key a script touches is passed in KEYS; on Redis Cluster,
put a hash tag in the prefix (e.g. "{aivedio}:") so they share a slot. Needs Redis >= 6.2 (ZADD GT).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import redis

from aivedio_engine.slots.base import (
    DEFAULT_RESEED_GAP,
    FenceUnavailable,
    Lease,
    RebuildReport,
    SlotStoreUnavailable,
    holders_by_scope_inverted,
    validate_chain,
)

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function ms(x) return string.format('%d', x) end
"""

_SEED = """
local function seed(key, floor, gap)
  local cur = redis.call('GET', key)
  if not cur then
    redis.call('SET', key, ms(floor + gap))
  elseif floor > tonumber(cur) then
    redis.call('SET', key, ms(floor))
  end
  return tonumber(redis.call('GET', key))
end
"""

# KEYS: fence, scopes, zset 1..n   ARGV: holder, ttl_ms, limit 1..n, name 1..n
# -> {1, fence} granted | {0, i} scope i full | {-1, 0} fence counter missing
_ACQUIRE = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local n = #KEYS - 2
for i = 1, n do
  local k = KEYS[i + 2]
  redis.call('ZREMRANGEBYSCORE', k, '-inf', ms(now))
  if redis.call('ZCARD', k) >= tonumber(ARGV[2 + i]) then return {0, i} end
end
local fence = redis.call('INCR', KEYS[1])
local token = ms(fence) .. ':' .. ARGV[1]
local exp = ms(now + tonumber(ARGV[2]))
for i = 1, n do
  redis.call('ZADD', KEYS[i + 2], exp, token)
  redis.call('SADD', KEYS[2], ARGV[2 + n + i])
end
return {1, fence}
"""
)

_LIVE = """
local function live_everywhere(first, last, token)
  for i = first, last do
    local s = redis.call('ZSCORE', KEYS[i], token)
    if (not s) or tonumber(s) <= now then return false end
  end
  return true
end
"""

# KEYS: zsets   ARGV: token, ttl_ms -> 1 renewed | 0 gone (its own remnants are removed)
_RENEW = (
    _NOW
    + _LIVE
    + """
if not live_everywhere(1, #KEYS, ARGV[1]) then
  for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
  return 0
end
local exp = ms(now + tonumber(ARGV[2]))
for i = 1, #KEYS do redis.call('ZADD', KEYS[i], 'XX', exp, ARGV[1]) end
return 1
"""
)

# KEYS: backed, zsets   ARGV: token -> 1 if it was live; only this token is ever removed
_RELEASE = (
    _NOW
    + _LIVE
    + """
local was = live_everywhere(2, #KEYS, ARGV[1])
for i = 2, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
redis.call('SREM', KEYS[1], ARGV[1])
if was then return 1 end
return 0
"""
)

_IS_CURRENT = (
    _NOW
    + _LIVE
    + """
if live_everywhere(1, #KEYS, ARGV[1]) then return 1 end
return 0
"""
)

# KEYS: zsets -> live count of each, after purging expired members
_COUNTS = (
    _NOW
    + """
local out = {}
for i = 1, #KEYS do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', ms(now))
  out[i] = redis.call('ZCARD', KEYS[i])
end
return out
"""
)

# KEYS: fence   ARGV: floor, gap
_SEED_SCRIPT = (
    _NOW
    + _SEED
    + """
return seed(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
"""
)

# KEYS: fence, scopes, backed, zset 1..n   ARGV: ttl_ms, floor, gap, json [names, [[holder, [idx...]], ...]]
# -> {kept, dropped, {holder, fence, ...added}, {count per zset}}; the rules are those of MemorySlotStore.rebuild
_REBUILD = (
    _NOW
    + _SEED
    + """
seed(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
local spec = cjson.decode(ARGV[4])
local names, want = spec[1], spec[2]
local exp = now + tonumber(ARGV[1])
local live, order = {}, {}
for i = 1, #names do
  local k = KEYS[3 + i]
  redis.call('ZREMRANGEBYSCORE', k, '-inf', ms(now))
  for _, tok in ipairs(redis.call('ZRANGE', k, 0, -1)) do
    local h = string.sub(tok, string.find(tok, ':', 1, true) + 1)
    if not live[h] then live[h] = {}; order[#order + 1] = h end
    if not live[h][tok] then live[h][tok] = {} end
    live[h][tok][i] = true
  end
end
local wanted = {}
for _, pair in ipairs(want) do wanted[pair[1]] = pair[2] end
local function fence_of(tok) return tonumber(string.sub(tok, 1, string.find(tok, ':', 1, true) - 1)) end
local function owner(toks, idxs)
  if (not toks) or (not idxs) then return nil end
  local best, bestf = nil, -1
  for tok, where in pairs(toks) do
    local complete = true
    for _, i in ipairs(idxs) do if not where[i] then complete = false; break end end
    if complete and fence_of(tok) > bestf then best, bestf = tok, fence_of(tok) end
  end
  return best
end
local keep, kept, dropped = {}, 0, 0
for _, h in ipairs(order) do
  local toks, idxs = live[h], wanted[h]
  local own = owner(toks, idxs)
  if own then
    for _, i in ipairs(idxs) do redis.call('ZADD', KEYS[3 + i], 'XX', 'GT', ms(exp), own) end
    keep[#keep + 1] = own
    kept = kept + 1
  end
  for tok, where in pairs(toks) do
    if tok ~= own and redis.call('SISMEMBER', KEYS[3], tok) == 1 then
      for i, _ in pairs(where) do redis.call('ZREM', KEYS[3 + i], tok) end
      dropped = dropped + 1
    end
  end
end
local added = {}
for _, pair in ipairs(want) do
  local h, idxs = pair[1], pair[2]
  if not owner(live[h], idxs) then
    local fence = redis.call('INCR', KEYS[1])
    local tok = ms(fence) .. ':' .. h
    for _, i in ipairs(idxs) do
      redis.call('ZADD', KEYS[3 + i], ms(exp), tok)
      redis.call('SADD', KEYS[2], names[i])
    end
    keep[#keep + 1] = tok
    added[#added + 1] = h
    added[#added + 1] = fence
  end
end
redis.call('DEL', KEYS[3])
for _, tok in ipairs(keep) do redis.call('SADD', KEYS[3], tok) end
local counts = {}
for i = 1, #names do counts[i] = redis.call('ZCARD', KEYS[3 + i]) end
return {kept, dropped, added, counts}
"""
)


_F = TypeVar("_F", bound=Callable[..., Any])
#: what "Redis is not there" looks like; a script error or a wrong type is a bug and propagates as it is
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


def _reachable(method: _F) -> _F:
    """Turn "cannot reach Redis" into `SlotStoreUnavailable`, the one signal the dispatcher degrades on."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except _UNREACHABLE as exc:
            raise SlotStoreUnavailable(f"slot store unreachable: {exc}") from exc

    return wrapper  # type: ignore[return-value]


class RedisSlotStore:
    def __init__(
        self,
        client: redis.Redis,
        *,
        key_prefix: str = "aivedio:",
        fence_floor: Callable[[], int] | None = None,
        reseed_gap: int = DEFAULT_RESEED_GAP,
    ) -> None:
        self._r = client
        self._p = key_prefix + "slots:"
        self._fence_floor = fence_floor
        self._gap = reseed_gap
        self._fence_key, self._scopes_key, self._backed_key = (self._p + k for k in ("fence", "scopes", "backed"))
        reg = client.register_script
        self._acquire, self._renew, self._release = reg(_ACQUIRE), reg(_RENEW), reg(_RELEASE)
        self._is_current, self._counts, self._seed = reg(_IS_CURRENT), reg(_COUNTS), reg(_SEED_SCRIPT)
        self._rebuild = reg(_REBUILD)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisSlotStore:
        # bounded waits: a Redis that hangs must degrade the dispatcher in seconds, not block it
        return cls(redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5), **kwargs)

    def zset_key(self, scope: str) -> str:
        return self._p + "s:" + scope

    @_reachable
    def acquire(self, scope_chain: Sequence[tuple[str, int]], holder: str, ttl_s: float) -> Lease | None:
        validate_chain(scope_chain)
        names = tuple(s for s, _ in scope_chain)
        keys = [self._fence_key, self._scopes_key, *map(self.zset_key, names)]
        args: list[str | int] = [str(holder), _ms(ttl_s), *(int(limit) for _, limit in scope_chain), *names]
        status, value = self._acquire(keys=keys, args=args)
        if status == -1:
            # the counter is gone (flush, restart without persistence): re-create it above every fence the
            # database knows before granting anything, or fences would repeat
            self.seed_fence(self._fence_floor() if self._fence_floor else 0)
            status, value = self._acquire(keys=keys, args=args)
            if status == -1:
                raise FenceUnavailable("fence counter missing right after seeding it")
        if status == 0:
            return None
        return Lease(str(holder), int(value), names)

    @_reachable
    def renew(self, lease: Lease, ttl_s: float) -> bool:
        keys = [self.zset_key(s) for s in lease.scopes]
        return bool(self._renew(keys=keys, args=[lease.token, _ms(ttl_s)]))

    @_reachable
    def release(self, lease: Lease) -> bool:
        keys = [self._backed_key, *(self.zset_key(s) for s in lease.scopes)]
        return bool(self._release(keys=keys, args=[lease.token]))

    @_reachable
    def release_many(self, leases: Sequence[Lease]) -> int:
        if len(leases) <= 1:
            return sum(self.release(lease) for lease in leases)
        pipe = self._r.pipeline(transaction=False)  # each release script is atomic on its own
        for lease in leases:
            keys = [self._backed_key, *(self.zset_key(s) for s in lease.scopes)]
            self._release(keys=keys, args=[lease.token], client=pipe)
        return sum(bool(freed) for freed in pipe.execute())

    @_reachable
    def is_current(self, lease: Lease) -> bool:
        return bool(self._is_current(keys=[self.zset_key(s) for s in lease.scopes], args=[lease.token]))

    @_reachable
    def counts(self) -> dict[str, int]:
        names = sorted(_text(n) for n in self._r.smembers(self._scopes_key))
        if not names:
            return {}
        values = self._counts(keys=[self.zset_key(n) for n in names])
        return {n: int(v) for n, v in zip(names, values, strict=True) if int(v)}

    @_reachable
    def current_fence(self) -> int:
        value = self._r.get(self._fence_key)
        return int(value) if value is not None else 0

    @_reachable
    def seed_fence(self, floor: int) -> int:
        return int(self._seed(keys=[self._fence_key], args=[int(floor), self._gap]))

    @_reachable
    def rebuild(self, active: Mapping[str, Sequence[str]], *, ttl_s: float, fence_floor: int = 0) -> RebuildReport:
        want = holders_by_scope_inverted(active)
        known = {_text(n) for n in self._r.smembers(self._scopes_key)}
        names = sorted(known | {s for scopes in want.values() for s in scopes})
        index = {n: i + 1 for i, n in enumerate(names)}  # Lua arrays are 1-based
        spec = json.dumps([names, [[h, [index[s] for s in scopes]] for h, scopes in want.items()]])
        keys = [self._fence_key, self._scopes_key, self._backed_key, *map(self.zset_key, names)]
        kept, dropped, added_flat, counts = self._rebuild(
            keys=keys, args=[_ms(ttl_s), int(fence_floor), self._gap, spec]
        )
        added = tuple(
            Lease(h, int(f), want[h]) for h, f in zip(map(_text, added_flat[0::2]), added_flat[1::2], strict=True)
        )
        return RebuildReport(
            added, int(kept), int(dropped), {n: int(c) for n, c in zip(names, counts, strict=True) if int(c)}
        )

    def delete_all(self) -> int:
        """Remove every key of this store (tests, `aivedio` operators resetting a staging Redis)."""
        keys = list(self._r.scan_iter(match=_glob_escape(self._p) + "*", count=500))
        return int(self._r.delete(*keys)) if keys else 0

    def close(self) -> None:
        self._r.close()


def _ms(ttl_s: float) -> int:
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
    return max(1, round(ttl_s * 1000))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
