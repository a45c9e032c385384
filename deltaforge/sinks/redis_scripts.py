"""The Lua scripts the Redis sink adds its entries with (``redis.py`` says why a script), and
how its calls are cut."""

from __future__ import annotations

from typing import Any

_LAST_ID = """
local function last_id(key)
  local exists = redis.pcall('EXISTS', key)
  if type(exists) ~= 'number' then return '' end
  if exists == 0 then return '0-0' end
  local info = redis.pcall('XINFO', 'STREAM', key)
  if type(info) ~= 'table' or info.err then return '' end
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] end
  end
  return ''
end
local before = last_id(KEYS[1])
local id = before
"""
"""Both scripts start by reading the stream's last ID (which trimming and XDEL leave alone) and
return ``{added, that ID, the stream's last ID after}``: a stream that ends before what this sink
was acknowledged lost entries (``acknowledged.py``). A user the ACL does not allow ``EXISTS`` or
``XINFO`` gets ``''`` (not known), and no check."""

EXACTLY_ONCE = (
    _LAST_ID
    + """
local wm = redis.call('GET', KEYS[2]) or ''
local maxlen = tonumber(ARGV[1])
local added = 0
local last = wm
for i = 2, #ARGV, 3 do
  local pos = ARGV[i]
  if pos > last then
    if maxlen > 0 then
      id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'event', ARGV[i + 1], 'idempotency_key', ARGV[i + 2])
    else
      id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[i + 1], 'idempotency_key', ARGV[i + 2])
    end
    last = pos
    added = added + 1
  end
end
if last ~= wm then redis.call('SET', KEYS[2], last) end
return {added, before, id}
"""
)


APPEND = (
    _LAST_ID
    + """
local maxlen = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  if maxlen > 0 then
    id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'event', ARGV[i], 'idempotency_key', ARGV[i + 1])
  else
    id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[i], 'idempotency_key', ARGV[i + 1])
  end
end
return {(#ARGV - 1) / 2, before, id}
"""
)

PER_CALL = 1000
"""Events per script call: the server runs nothing else while a script runs, so a large batch
is split rather than holding other clients up for the whole of it."""

Call = tuple[list[str], list[Any]]
"""One script call: its keys and its arguments."""
