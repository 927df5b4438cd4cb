"""Token buckets in Redis (distributed mode): one Lua script takes a token atomically, so every API process
draws from the same bucket. The script is `domain.ratelimit.take` written again; tests hold the two to the
same answers.

Key: `{key_prefix}ratelimit:{key}`, a hash (tokens, at). It expires once the bucket would be full again, which
loses nothing: a missing bucket is a full one. Time is Redis's own clock (`TIME`), so clock skew between API
hosts cannot mint tokens; tests may pass their own clock instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from aivedio_engine.domain.ratelimit import EPSILON, Rate, Verdict

# KEYS: bucket   ARGV: per_s, burst, cost, now ('' = the server's clock)[, n takes (default 1)]
#   -> {allowed, remaining, retry_after_s} per take, one after the other: n takes give what n calls would
_TAKE = f"""
local per_s, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n = tonumber(ARGV[5] or '1')
local now
if ARGV[4] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
else
  now = tonumber(ARGV[4])
end
local s = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = burst, now
if s[1] and s[2] then
  local last = tonumber(s[2])
  tokens = math.min(burst, tonumber(s[1]) + math.max(0, now - last) * per_s)
  at = math.max(last, now)
end
local function f(x) return string.format('%.17g', x) end
local out = {{}}
for _ = 1, n do
  local allowed, retry = 0, 0
  if tokens + {EPSILON!r} >= cost then
    allowed = 1
    tokens = math.max(0, tokens - cost)
  else
    retry = (cost - tokens) / per_s
  end
  out[#out + 1] = allowed
  out[#out + 1] = f(tokens)
  out[#out + 1] = f(retry)
end
redis.call('HSET', KEYS[1], 'tokens', f(tokens), 'at', f(at))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / per_s * 1000) + 1000)
return out
"""


class RedisBucketStore:
    #: what makes FallbackBucketStore limit per process instead: not only a refused connection or a timeout, but
    #: any error of the server (a replica answering READONLY during a failover) — creates must go on meanwhile
    UNREACHABLE: tuple[type[BaseException], ...] = (redis.RedisError,)

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str = "aivedio:",
        *,
        server_time: bool = True,
        loop_client: Callable[[], Any] | None = None,
    ) -> None:
        self._client = client
        self._p = key_prefix + "ratelimit:"
        self._server_time = server_time
        self._take = client.register_script(_TAKE)
        #: makes the asyncio client of `take_on_loop`, on the loop that first needs it
        self._loop_client = loop_client
        self._on_loop: _LoopTakes | None = None

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisBucketStore:
        # short timeouts: a create must not wait on a dead Redis longer than the fallback needs to take over
        client = redis.Redis.from_url(url, socket_connect_timeout=0.25, socket_timeout=0.5)
        # on the event loop a read's timeout is a timer of the loop: a loop busy with other requests (or a process
        # short of CPU) can fire it after the answer has arrived, so it is longer there; a waiting create holds
        # no thread, and once one has failed the fallback spares the others the wait (`FallbackBucketStore`)
        loop_options: dict[str, Any] = {"socket_connect_timeout": 1.0, "socket_timeout": 1.0}
        return cls(client, loop_client=lambda: redis.asyncio.Redis.from_url(url, **loop_options), **kwargs)

    def key(self, key: str) -> str:
        return self._p + key

    def take(self, key: str, rate: Rate, now: float) -> Verdict:
        allowed, remaining, retry = self._take(keys=[self.key(key)], args=self._args(rate, now))
        return Verdict(bool(int(allowed)), float(remaining), float(retry))

    async def take_on_loop(self, key: str, rate: Rate, now: float) -> Verdict:
        """`take` for an event loop. The takes that queue while one round trip is out go together in the next
        (`_LoopTakes._send`): every take keeps its own answer, as if sent alone, but a busy API process sends one
        command batch (one write, one read) instead of one per request (docs/decisions/0011-create-path.md)."""
        loop = asyncio.get_running_loop()
        if self._on_loop is None or self._on_loop.loop is not loop:  # an asyncio client serves one loop
            if self._loop_client is None:
                raise RuntimeError("this store was built without an asyncio client (RedisBucketStore.from_url)")
            self._on_loop = _LoopTakes(loop, self._loop_client())
        allowed, remaining, retry = await self._on_loop.take(self.key(key), self._args(rate, now))
        return Verdict(bool(int(allowed)), float(remaining), float(retry))

    def _args(self, rate: Rate, now: float) -> list[str]:
        now_arg = "" if self._server_time else repr(float(now))
        return [repr(rate.per_s), repr(float(rate.burst)), "1", now_arg]


class _LoopTakes:
    """The take script on one event loop's asyncio client, the takes queued meanwhile sent as one pipeline."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        self.loop = loop
        self._client = client
        self._script = client.register_script(_TAKE)
        self._queued: list[tuple[str, list[str], asyncio.Future[Any]]] = []
        self._sending = False
        self._sender: asyncio.Task[None] | None = None  # held so it is not collected while running

    async def take(self, key: str, args: list[str]) -> Any:
        future: asyncio.Future[Any] = self.loop.create_future()
        self._queued.append((key, args, future))
        if not self._sending:
            self._sending = True
            self._sender = self.loop.create_task(self._send_queued())
        return await future

    async def _send_queued(self) -> None:
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                try:
                    results = await self._send(batch)
                    if len(results) != len(batch):  # never expected; but no take may be left without an answer
                        raise redis.RedisError(f"{len(results)} answers to {len(batch)} takes")
                except Exception as exc:  # noqa: BLE001 — unreachable or refused: each take of the batch hears it
                    results = [exc] * len(batch)
                except BaseException:  # cancelled (the loop is closing): nobody is left hanging on an answer
                    for _, _, future in (*batch, *self._queued):
                        future.cancel()
                    raise
                for (_, _, future), result in zip(batch, results, strict=True):
                    if future.done():  # the request went away
                        continue
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(result)
        finally:
            # no await between the last look at the queue and this: a take queued after it starts a sender
            self._sending = False

    async def _send(self, batch: list[tuple[str, list[str], asyncio.Future[Any]]]) -> list[Any]:
        """The batch's answers in its order. The takes of one bucket go as one script call taking n tokens one
        after the other (under load, one tenant's requests fill most of a batch), the buckets as one pipeline."""
        groups: dict[tuple[str, tuple[str, ...]], list[int]] = {}
        for i, (key, args, _) in enumerate(batch):
            groups.setdefault((key, tuple(args)), []).append(i)
        calls = [(key, [*args, str(len(places))]) for (key, args), places in groups.items()]
        if len(calls) == 1:
            answers = [await self._script(keys=[calls[0][0]], args=calls[0][1])]
        else:
            pipe = self._client.pipeline(transaction=False)
            for key, args in calls:
                pipe.evalsha(self._script.sha, 1, key, *args)
            answers = list(await pipe.execute(raise_on_error=False))
            for i, answer in enumerate(answers):
                if isinstance(answer, redis.exceptions.NoScriptError):  # a restarted Redis: the script loads it again
                    answers[i] = await self._script(keys=[calls[i][0]], args=calls[i][1])
        results: list[Any] = [None] * len(batch)
        for places, answer in zip(groups.values(), answers, strict=True):
            if isinstance(answer, BaseException) or len(answer) != 3 * len(places):
                for i in places:
                    results[i] = answer if isinstance(answer, BaseException) else redis.RedisError(repr(answer))
                continue
            for n, i in enumerate(places):
                results[i] = answer[3 * n : 3 * n + 3]
        return results
