"""Write quotas: a per-pubkey token bucket kept in Redis, so every node shares one budget."""

from __future__ import annotations

import time

from django.conf import settings

from buzz.runtime import runtime

# KEYS[1] bucket; ARGV: capacity, refill per second, now (ms). Returns 1 when a token was taken.
_BUCKET = """
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil then tokens = cap; ts = now end
tokens = math.min(cap, tokens + (now - ts) * rate / 1000)
local ok = 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 end
redis.call('HSET', KEYS[1], 't', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return ok
"""


def quota() -> dict[str, float]:
    q: dict[str, float] = settings.BUZZ_WRITE_QUOTA
    return q


async def take_write_token(community_id: int, pubkey: str) -> bool:
    """True when pubkey may write now. A Redis failure raises: the caller answers `error:`, never skips the quota."""
    q = quota()
    if q["per_second"] <= 0:
        return True
    script = runtime.redis().register_script(_BUCKET)  # EVALSHA, falling back to EVAL once
    key = f"{settings.BUZZ_REDIS_PREFIX}quota:{community_id}:{pubkey}"
    result = await script(keys=[key], args=[q["burst"], q["per_second"], int(time.time() * 1000)])
    return bool(result)
