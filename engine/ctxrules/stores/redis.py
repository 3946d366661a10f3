"""The Redis store: sessions shared by many workers (docs/stores.md).

``RedisStore.from_url("redis://host:6379/0?ttl_s=86400")`` (also ``rediss://`` and
``unix:///run/redis.sock``). Every key starts ``ctxrules:v1:``; one session's keys carry the
hash tag ``{<session>}`` so they live in one Redis Cluster slot::

    ctxrules:v1:{S}:state         the turn's state (JSON)
    ctxrules:v1:{S}:output        the last output, a list of JSON messages (a warm turn appends)
    ctxrules:v1:{S}:rev           a counter bumped by every commit (readers' cache key)
    ctxrules:v1:{S}:meta          a hash: when the session was last used, blob TTL upkeep
    ctxrules:v1:{S}:blobs         the set of vault ids the session references
    ctxrules:v1:{S}:media         vault id -> media type
    ctxrules:v1:{S}:doc:<name>    notes, touched, router, checkpoint, root
    ctxrules:v1:{S}:log:<kind>:records|totals|gen   the session ledger (and descendants)
    ctxrules:v1:{S}:lock          the prepare lock (a random token, SET NX PX)
    ctxrules:v1:{S}:prepares      when each prepare held the lock (server clock), the last 1000
    ctxrules:v1:{S}:compaction    the compaction lock
    ctxrules:v1:{S}:secret:<name> a session's secrets
    ctxrules:v1:blob:<sha256>     vault bytes, shared by every session that references them
    ctxrules:v1:{log:day:D}:…     the day ledger of D (and {log:goal:G}, {log:misroutes})
    ctxrules:v1:{secret}:<name>   store-wide secrets (the injection key)

Writes of one session go in one ``MULTI`` on its slot (a Lua script for the turn itself, which
checks the lock token and appends or replaces the output); vault blobs, which live in other
slots, are written ``SET NX EX`` in a pipeline of their own. A warm turn is one round trip to
read (the state, and the output only when another worker wrote it) and one to write.

TTLs: every session key expires ``ttl_s`` (default 7 days) after the session's last commit;
blobs get twice that and are extended (``EXPIRE GT``) whenever a session reads or writes them
and, at most every ``ttl_s / 2``, for every blob a live session references, so a blob outlives
every session that references it. Nothing newer than Redis 7.0 is used.

Settings are URL query parameters or constructor options (never pack keys): ``ttl_s``,
``log_ttl_s`` (day/goal ledgers, default 90 days, 0 keeps them), ``connect_timeout_s``,
``socket_timeout_s``, ``lock_timeout_s`` (how long a prepare waits for another worker's lock),
``lock_ttl_s`` (the lease, renewed while held), ``on_error`` (``fail``, or ``local``: an
in-memory store for the call when Redis cannot be reached).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from ctxrules.logs import get_logger
from ctxrules.session_store import unusable_state  # the filesystem store's check of a state
from ctxrules.stores import redacted  # the URL without a password, for messages
from ctxrules.stores.base import (
    DOCS,
    SECRET_BYTES,
    SESSION_ID_RE,
    CompactionBusy,
    DocName,
    Log,
    LogChunk,
    LogKind,
    SessionExists,
    SpooledBlobWriter,
    StoreError,
    StoreLockTimeout,
    StoreUnavailable,
    Turn,
    VaultError,
)
from ctxrules.stores.memory import MemoryStore
from ctxrules.threads import after_fork_in_child, helper_thread

__all__ = ["RedisStore", "RedisStoreSettings"]

PREFIX: Final = "ctxrules:v1:"
STATE_VERSION: Final = 1
_UNREACHABLE: Final = "CR148"
_LOCK_CODE: Final = "CR149"
_BLOB_TTL_FACTOR: Final = 2
_PREPARES_KEPT: Final = 1000
_MAX_SECONDS: Final = 10 * 365 * 24 * 3600  # ten years: any setting of seconds
_SECRET_CHECK_S = 60.0
"""How long a worker uses its copy of a store's secret before asking the store again."""

_log = get_logger("ctxrules.store")
# What a server that cannot be reached (or a Cluster that lost a slot's node) raises.
_UNREACHABLE_ERRORS: Final = (
    TimeoutError,
    OSError,
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
)
# What a server that accepted but does not answer raises (redis-py's, or the socket's own).
_UNANSWERED_ERRORS: Final = (TimeoutError, redis.TimeoutError)
T = TypeVar("T")


# --- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RedisStoreSettings:
    """What a ``redis://`` URL's query (or the constructor) may set; see the module docstring."""

    ttl_s: float = 7 * 24 * 3600.0
    log_ttl_s: float = 90 * 24 * 3600.0
    connect_timeout_s: float = 2.0
    socket_timeout_s: float = 5.0
    lock_timeout_s: float = 120.0
    lock_ttl_s: float = 30.0
    on_error: Literal["fail", "local"] = "fail"
    cluster: bool = False

    def __post_init__(self) -> None:
        # At most _MAX_SECONDS: Redis takes no infinite or astronomic expiry, nor the socket
        # such a timeout (they were an OverflowError at the first command, not a CR148).
        for name in ("ttl_s", "connect_timeout_s", "socket_timeout_s", "lock_ttl_s"):
            if not 0 < getattr(self, name) <= _MAX_SECONDS:
                raise _bad(
                    f"{name} must be a number of seconds above 0 and at most {_MAX_SECONDS}, "
                    f"got {getattr(self, name)!r}"
                )
        for name in ("log_ttl_s", "lock_timeout_s"):
            if not 0 <= getattr(self, name) <= _MAX_SECONDS:
                raise _bad(
                    f"{name} must be a number of seconds (0 or more) and at most {_MAX_SECONDS}, "
                    f"got {getattr(self, name)!r}"
                )
        if self.on_error not in ("fail", "local"):
            raise _bad(f"on_error must be 'fail' or 'local', got {self.on_error!r}")


_OURS: Final = frozenset(RedisStoreSettings.__dataclass_fields__)
# The redis client's own URL options that make sense for a store; anything else is refused
# (the client would pass an unknown one on as a keyword and fail at the first command).
_CLIENT_OPTIONS: Final = frozenset(
    {
        "db",
        "client_name",
        "health_check_interval",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
        "ssl_min_version",
    }
)


class _BadOption(StoreError):
    pass


class _Unreachable(StoreUnavailable):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # what the client said, for the on_error=local note


def _bad(message: str) -> StoreError:
    return _BadOption(f"[{_UNREACHABLE}] Redis store option: {message}")


def _split_url(url: str) -> tuple[str, dict[str, Any]]:
    """The URL the client gets (its own options only) and our settings from the query."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise _bad(f"{redacted(url)!r} is not a redis://, rediss:// or unix:// URL")
    database = parts.path[1:]
    if parts.scheme != "unix" and database and not (database.isascii() and database.isdecimal()):
        # The client took a database that is not a number (redis://host/abc) for db 0.
        raise _bad(f"the database in {redacted(url)!r} is not a number (redis://host:6379/0)")
    ours: dict[str, Any] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _OURS:
            if key == "on_error":
                ours[key] = value
                continue
            if key == "cluster":
                if value.lower() not in ("1", "0", "yes", "no", "true", "false"):
                    raise _bad(f"cluster={value!r} in {redacted(url)!r}: give cluster=yes or cluster=no")
                ours[key] = value.lower() in ("1", "yes", "true")
                continue
            try:
                ours[key] = float(value)
            except ValueError:
                raise _bad(f"{key}={value!r} in {redacted(url)!r} is not a number of seconds") from None
        elif key in _CLIENT_OPTIONS:
            theirs.append((key, value))
        else:
            known = ", ".join(sorted(_OURS | _CLIENT_OPTIONS))
            raise _bad(f"unknown option {key!r} in {redacted(url)!r} (known: {known})")
    return _base(url) + ("?" + urlencode(theirs) if theirs else ""), ours


def _base(url: str) -> str:
    # Not urlunsplit: it writes ``unix:///path`` back as ``unix:/path``, which the client refuses.
    return url.split("#", 1)[0].split("?", 1)[0]


# --- Lua ------------------------------------------------------------------------------------

# What the scripts below share. A key holding another Redis type than ctxrules writes there (its
# last part says which) is damaged (docs/stores.md "Damaged keys"): heal() removes it (a ledger's
# records take its totals and generation along: the ledger starts anew and its readers read it
# again from the start) and says what it was; reset() marks the session's turn as reset, so the
# next load (of any worker) computes it from the full history and says why; restart() moves a
# revision counter past every revision a worker may hold (the server's time in ms).
_HEAL = """
local function kind(key)
  local part = string.match(key, '[^:]*$')
  if part == 'output' or part == 'records' or part == 'prepares' then return 'list' end
  if part == 'meta' or part == 'media' or part == 'totals' then return 'hash' end
  if part == 'blobs' then return 'set' end
  return 'string'
end
local function heal(from, skip)
  local found = {}
  for i = from, #KEYS do
    local got = redis.call('TYPE', KEYS[i]).ok
    if i ~= skip and got ~= 'none' and got ~= kind(KEYS[i]) then
      redis.call('DEL', KEYS[i])
      if string.sub(KEYS[i], -8) == ':records' then
        local base = string.sub(KEYS[i], 1, -8)
        redis.call('DEL', base .. 'totals', base .. 'gen')
      end
      found[#found + 1] = string.match(KEYS[i], '}:(.*)$') .. ' was a ' .. got
    end
  end
  return found
end
local function restart(rev, ttl)
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  local held = redis.call('GET', rev)
  if held and string.match(held, '^%d+$') and string.len(held) < 16 and tonumber(held) >= now then
    now = tonumber(held) + 1
  end
  redis.call('SET', rev, string.format('%d', now), 'PX', ttl)
end
local function reset(state, rev, found, ttl)
  restart(rev, ttl)
  local why = 'the stored session had keys of the wrong Redis type (' .. table.concat(found, ', ') .. ') and was reset'
  redis.call('SET', state, cjson.encode({version = 1, recovered = why}), 'PX', ttl)
end
"""

# The turn, one script on the session's slot: refuse when the caller's lock token is no longer
# the lock's (a worker paused past its lease must not overwrite the turn of the worker that took
# over); append to the output only when nobody committed since this client's last commit (else
# the client sends all of it); then mark the session used and push the expiry of every one of
# its keys out, but the lock's (it keeps its lease).
# KEYS: state, output, rev, lock, meta, then every other key of the session. ARGV: state, mode
# (1 append, 0 replace), the revision an append expects, the lock token ('' none), ttl in ms,
# the time, then the output lines. Returns {rev, or -1 (the lock is another's), -4 (the lock is
# gone: its lease ran out and nobody took it, or the server lost it) or -2 (append refused);
# when the session's blobs last had their TTLs extended}.
_COMMIT = (
    _HEAL
    + """
if ARGV[4] ~= '' and (redis.call('TYPE', KEYS[4]).ok ~= 'string' or redis.call('GET', KEYS[4]) ~= ARGV[4]) then
  return {redis.call('EXISTS', KEYS[4]) == 1 and -1 or -4, false}
end
if #heal(1, 4) > 0 then
  -- Keys of the wrong type (removed): the turn is written whole, under a restarted counter.
  restart(KEYS[3], ARGV[5])
  if ARGV[2] == '1' then return {-2, false} end
end
local held = redis.call('GET', KEYS[3]) or '0'
local rev = tonumber(held)
if not string.match(held, '^%d+$') then
  -- A damaged counter restarts past every revision a client may hold (their cache keys).
  rev = -3
  redis.call('SET', KEYS[3], string.format('%d', math.floor(tonumber(ARGV[6]) * 1000)))
end
if ARGV[2] == '1' then
  if rev ~= tonumber(ARGV[3]) then return {-2, false} end
else
  redis.call('DEL', KEYS[2])
end
local n = #ARGV
local i = 7
while i <= n do
  local j = math.min(i + 999, n)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, j))
  i = j + 1
end
redis.call('SET', KEYS[1], ARGV[1])
rev = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[5], 'used', ARGV[6])
for k = 1, #KEYS do
  if k ~= 4 then redis.call('PEXPIRE', KEYS[k], ARGV[5]) end
end
return {rev, redis.call('HGET', KEYS[5], 'blobs_extended')}
"""
)

# Repair a session's keys (ARGV[2] '1'; KEYS: state, rev, then its other keys) as a prepare does
# when it takes the lock, and a damaged revision counter (not a decimal integer) as the commit
# does; or only remove the keys of the wrong type among KEYS ('0': a ledger's records, gen and
# totals). ARGV[1]: the TTL in ms. Returns what was of the wrong type.
_REPAIR = (
    _HEAL
    + """
local found = heal(1, 0)
if ARGV[2] == '1' then
  local held = redis.call('GET', KEYS[2])
  if #found > 0 then
    reset(KEYS[1], KEYS[2], found, ARGV[1])
  elseif held and not string.match(held, '^%d+$') then
    restart(KEYS[2], ARGV[1])
  end
end
return found
"""
)

# Read the turn. ARGV[1]: the revision the client holds (state, and output when ARGV[2] asks for
# it); then nothing but the revision comes back: a warm turn on the worker that committed the
# last one transfers and parses nothing.
_LOAD = """
local rev = redis.call('GET', KEYS[2]) or '0'
if rev == ARGV[1] then return {'=', rev} end
local st = redis.call('GET', KEYS[1])
if ARGV[2] == '1' then return {st or false, rev, redis.call('LRANGE', KEYS[3], 0, -1)} end
return {st or false, rev}
"""

# Take a lock; on success, the server's time (one clock for every worker). A lock that already
# holds the caller's token is the caller's own, left by a round trip whose answer never came
# (RedisStore._doubtful): taken over, its lease renewed.
# A lock key that is not a string with a lease was not written by ctxrules and would never be
# released: it is removed. The prepare lock's KEYS go on with the session's (state and rev first),
# repaired as _REPAIR does (ARGV[3]: the TTL in ms) once the lock is taken.
_ACQUIRE = (
    _HEAL
    + """
local found = {}
local got = redis.call('TYPE', KEYS[1]).ok
if got ~= 'none' and (got ~= 'string' or redis.call('PTTL', KEYS[1]) == -1) then
  redis.call('DEL', KEYS[1])
  found[1] = 'lock was a ' .. got .. (got == 'string' and ' without expiry' or '')
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
if #KEYS > 1 then
  for _, what in ipairs(heal(2, 0)) do found[#found + 1] = what end
  if #found > 0 then reset(KEYS[2], KEYS[3], found, ARGV[3]) end
end
local t = redis.call('TIME')
return t[1] .. '.' .. string.format('%06d', t[2])
"""
)

# Extend a lock only while it is still ours.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# Release a lock only while it is still ours (compare-and-delete), recording the hold.
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if KEYS[2] then
  local t = redis.call('TIME')
  redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. t[1] .. '.' .. string.format('%06d', t[2]) .. ' ' .. ARGV[3])
  redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
end
return 1
"""

# Append unless a record has the same value at ARGV[2] (compared as ARGV[4] says: a string or a
# number), or the log already holds ARGV[5] records. KEYS: records, gen, totals.
_APPEND_ONCE = (
    _HEAL
    + """
heal(1, 0)
local wanted = ARGV[3]
if ARGV[4] == 'n' then wanted = tonumber(wanted) end
local lines = redis.call('LRANGE', KEYS[1], 0, -1)
for _, line in ipairs(lines) do
  local ok, obj = pcall(cjson.decode, line)
  if ok and type(obj) == 'table' and obj[ARGV[2]] == wanted then return 'present' end
end
if #lines >= tonumber(ARGV[5]) then return 'full' end
redis.call('SET', KEYS[2], ARGV[6], 'NX')
redis.call('RPUSH', KEYS[1], ARGV[1])
if tonumber(ARGV[7]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
end
return 'added'
"""
)

# Read a log after a cursor: the records and the log's generation (a new one: it was replaced),
# and what was of the wrong type. KEYS: records, gen, totals.
_READ_LOG = (
    _HEAL
    + """
local found = heal(1, 0)
local gen = redis.call('GET', KEYS[2]) or ''
local from = tonumber(ARGV[2])
if gen ~= ARGV[1] then from = 0 end
return {gen, redis.call('LRANGE', KEYS[1], from, -1), found}
"""
)

# A log's generation and length (KEYS: records, gen, totals), what a prepare reads with its lock.
_LOG_LENGTH = (
    _HEAL
    + """
heal(1, 0)
return {redis.call('GET', KEYS[2]) or '', redis.call('LLEN', KEYS[1])}
"""
)


# Make a session written inside RedisStore.creating() a session, unless one is there already.
# KEYS: meta, the marker kept aside. ARGV: ttl in ms, the time. Returns 1, or 0 (it exists).
_PUBLISH = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('RENAME', KEYS[2], KEYS[1]) end
redis.call('HSET', KEYS[1], 'used', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# Remove what an unfinished creating() wrote (KEYS[2..]), unless the session exists (KEYS[1],
# its meta): then they are the session's own. Returns 1 when removed.
_DROP_UNMADE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
"""


# --- keys -----------------------------------------------------------------------------------


def _skey(session: str, part: str) -> str:
    return f"{PREFIX}{{{session}}}:{part}"


def _blob_key(blob_id: str) -> str:
    return f"{PREFIX}blob:{blob_id}"


def _log_base(log: Log) -> str:
    if log.kind == "session":
        return _skey(log.name, "log:session")
    if log.kind == "descendants":
        return _skey(log.name, "log:descendants")
    tag = f"log:{log.kind}" if log.kind == "misroutes" else f"log:{log.kind}:{log.name}"
    return f"{PREFIX}{{{tag}}}:log"


_SESSION_PARTS: Final = (
    "state",
    "output",
    "rev",
    "meta",
    "blobs",
    "media",
    "prepares",
    *(f"doc:{name}" for name in DOCS),
    *(f"log:{kind}:{suffix}" for kind in ("session", "descendants") for suffix in ("records", "totals", "gen")),
)
"""Every key of a session that expires with it (locks carry their own lease; secrets are set
with the TTL when made)."""
_SESSION_REST: Final = tuple(p for p in _SESSION_PARTS if p not in ("state", "rev"))
_UNMADE_META: Final = "creating:meta"
"""Where a session :meth:`RedisStore.creating` writes keeps its ``meta`` until it is made (a
hash, as its last part tells the scripts' type check)."""


def _log_keys(log: Log) -> list[str]:
    """A log's keys as its scripts take them: records, gen, totals."""
    base = _log_base(log)
    return [base + ":records", base + ":gen", base + ":totals"]


_HEX: Final = frozenset("0123456789abcdef")


def _vault_ids(members: Iterable[bytes]) -> list[str]:
    """The members of a session's ``blobs`` set that are vault ids: anything else planted there
    (bytes that are not UTF-8, ``../../etc/passwd``) reads as absent, as other damaged values."""
    out = []
    for member in members:
        text = member.decode("ascii", "replace")
        if len(text) == 64 and set(text) <= _HEX:
            out.append(text)
    return out


def _check_blob_id(blob_id: str) -> str:
    if len(blob_id) != 64 or not set(blob_id) <= _HEX:
        raise VaultError(f"invalid vault id {blob_id!r}: expected a full sha256 id (64 hex digits)")
    return blob_id


# --- the store ------------------------------------------------------------------------------


@dataclass
class _Cached:
    """What this store object knows of a session's last turn (it wrote or verified it)."""

    rev: int = 0
    state: dict[str, Any] | None = None
    output: list[dict[str, Any]] | None = None
    digest: Any = None  # sha256 object over the output's JSON lines
    seen: bool = False  # the session existed when this object last looked
    confirmed: str = ""  # the lock token under which this is known to be the stored turn
    output_known: bool = False  # output is what the store holds (None: it failed the digest)


@dataclass
class _Lease:
    key: str
    token: str
    lease_ms: int
    lost: bool = False
    acquired: str = "0"  # when, in the server's clock
    pid: int = field(default_factory=os.getpid)  # the process that took it (RedisStore._after_fork)


# redis-py names a pipeline's failing command with the start of its arguments: session keys and
# the first bytes of a value, conversation text, which must not reach a message or a log.
_PIPELINE_COMMAND = re.compile(r"Command # (\d+) \((\S*).*?\) of pipeline caused error: ", re.S)


def _reason(exc: BaseException) -> str:
    """What Redis said, without the command text redis-py quotes from a pipeline (its name kept)."""
    return _PIPELINE_COMMAND.sub(lambda m: f"command #{m.group(1)} ({m.group(2)}) of a pipeline: ", str(exc))


class RedisStore:
    """The :class:`ctxrules.stores.base.Store` on a Redis server (module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        client: redis.Redis | None = None,
        **options: Any,
    ) -> None:
        client_url, from_query = _split_url(url)
        unknown = set(options) - _OURS
        if unknown:
            raise _bad(f"unknown option(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_OURS))})")
        try:
            self.settings = RedisStoreSettings(**{**from_query, **options})
        except TypeError as exc:
            raise _bad(str(exc)) from None
        self.url = redacted(_base(url))
        self._client_url = client_url
        self._ttl_ms = int(self.settings.ttl_s * 1000)
        self._blob_ttl_s = int(self.settings.ttl_s * _BLOB_TTL_FACTOR) or 1
        self._log_ttl_ms = int(self.settings.log_ttl_s * 1000)
        self._lease_ms = max(int(self.settings.lock_ttl_s * 1000), 100)
        # Any: the client's replies are typed as sync-or-async unions; this module checks them.
        # Made on first use (a Cluster client connects when built): a server down at start-up is
        # then reported, or served from memory, like one that goes down later.
        self._given = client
        self._made: Any = None
        self._made_scripts: dict[str, Any] = {}
        self._lock = threading.RLock()
        self._cache: dict[str, _Cached] = {}
        self._creating: set[str] = set()  # sessions inside creating(): their marker is kept aside
        self._held: dict[str, _Lease] = {}  # session -> the prepare lock this object holds
        self._leases: dict[str, _Lease] = {}  # every lease to renew, by token
        # Lock key -> the token of a take or release whose answer never came (a timeout, the
        # connection lost): the server may hold that lock for us, with no call working under it
        # and nobody to release it. The next take of the key uses the token, so it takes back
        # what it left, where it waited out the lease (lock_ttl_s) or failed with CR149.
        self._doubtful: dict[str, str] = {}
        self._renewer: _Renewer | None = None
        self._secrets: dict[tuple[str | None, str], tuple[bytes, float]] = {}  # (value, when checked)
        self._local: MemoryStore | None = None  # the store serving this call when Redis is unreachable
        self._local_note: str | None = None
        self._active = 0  # prepare locks held through this object (a call in progress)
        # The last command that got no answer (see _call): (until when, the error, whether it
        # happened inside a prepare). Until then every command fails at once, as that one did.
        self._unanswered: tuple[float, Exception, bool] | None = None
        # Read in the round trip that took a session's prepare lock (by the lock's token): the
        # load_turn reply, and the generation and length of the ledgers this object reads.
        self._prefetched: dict[str, tuple[str, Any]] = {}
        self._log_lengths: dict[Log, tuple[str, str, int]] = {}
        self._logs_read: dict[Log, None] = {}  # the ledgers to ask about (the last 32 read)
        self._docs_prefetched: dict[str, tuple[str, dict[str, bytes | None]]] = {}
        self._closed = False
        after_fork_in_child(self)

    def _after_fork(self) -> None:
        """In a child forked from the process using this store (a server forking its workers):
        the leases are the parent's. Renewed by the child's renewer with its own, a lease the
        parent died holding stayed held as long as the child lived, every worker waiting on it;
        released by the child, it freed the parent's lock under the parent's call. The child
        renews and releases none of them, and a turn under one is not saved (they read as lost);
        its thread lock is a new one (another thread of the parent may have held it)."""
        self._lock = threading.RLock()
        for lease in (*self._leases.values(), *self._held.values()):
            lease.lost = True
        self._leases.clear()
        self._doubtful.clear()  # the parent's tokens: taking a lock with one takes the parent's
        self._renewer = None
        self._active = 0  # the parent's calls in progress are not the child's
        self._unanswered = None

    @property
    def _client(self) -> Any:
        # Any: the client's replies are typed as sync-or-async unions; this module checks them.
        if self._made is None:
            self._made = self._given if self._given is not None else self._connect()
        return self._made

    @property
    def _scripts(self) -> dict[str, Any]:
        if not self._made_scripts:
            client = self._client
            self._made_scripts = {
                name: client.register_script(src)
                for name, src in (
                    ("commit", _COMMIT),
                    ("repair", _REPAIR),
                    ("load", _LOAD),
                    ("acquire", _ACQUIRE),
                    ("renew", _RENEW),
                    ("release", _RELEASE),
                    ("read_log", _READ_LOG),
                    ("log_length", _LOG_LENGTH),
                    ("append_once", _APPEND_ONCE),
                    ("publish", _PUBLISH),
                    ("drop_unmade", _DROP_UNMADE),
                )
            }
        return self._made_scripts

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStore:
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r})"

    def _connect(self) -> Any:
        s = self.settings
        try:
            if s.cluster:
                from redis.cluster import RedisCluster

                # Any node's address: the client learns the others and routes each key to its slot.
                return RedisCluster.from_url(
                    self._client_url,
                    socket_connect_timeout=s.connect_timeout_s,
                    socket_timeout=s.socket_timeout_s,
                    retry=Retry(NoBackoff(), 0),
                )
            return redis.Redis.from_url(
                self._client_url,
                socket_connect_timeout=s.connect_timeout_s,
                socket_timeout=s.socket_timeout_s,
                # No retries: an unreachable server must be reported within the connect timeout.
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
            )
        except ValueError as exc:
            # The client's reason quotes parts of the address, which a password may have
            # spilled into (`redis://u:pa/ss@h` reads `pa` as the port): not said then.
            said = str(exc)
            if "@" in self._client_url.partition("://")[2]:
                said = "the address does not parse (percent-encode `/`, `@` and `:` in a password)"
            raise _bad(f"{self.url}: {said}") from None

    # --- errors and the local fallback ------------------------------------------------------

    def _unavailable(self, exc: Exception) -> _Unreachable:
        what = str(exc) or type(exc).__name__
        if isinstance(exc, redis.TimeoutError):
            what = f"no answer within {self.settings.socket_timeout_s:g}s ({what})"
        return _Unreachable(
            what,
            f"[{_UNREACHABLE}] cannot reach the Redis store {self.url}: {what} "
            f"(connect timeout {self.settings.connect_timeout_s:g}s; on_error=local would use an "
            "in-memory store for the call)",
        )

    def _call(
        self,
        op: Callable[[], T],
        local: Callable[[MemoryStore], T] | None = None,
        *,
        damaged: Callable[[], object] | None = None,
    ) -> T:
        """Run ``op`` against Redis; a connection failure is :class:`StoreUnavailable`, or with
        ``on_error=local`` the same operation on the in-memory store (``local``). A key of the
        wrong Redis type (``WRONGTYPE``): ``damaged`` repairs the keys ``op`` uses, and ``op``
        runs once more."""
        if self._local is not None and local is not None:
            return local(self._local)
        unanswered = self._unanswered
        if unanswered is not None and time.monotonic() < unanswered[0]:
            # A server that left a command of this call unanswered is not asked again: every
            # later read, stage and lock would wait its own socket timeout on it.
            if self.settings.on_error != "local" or local is None:
                raise self._unavailable(unanswered[1])
            return local(self._fall_back(unanswered[1]))
        try:
            return op()
        except _UNREACHABLE_ERRORS as exc:
            if isinstance(exc, _UNANSWERED_ERRORS):
                self._unanswered = (time.monotonic() + self.settings.socket_timeout_s, exc, self._active > 0)
            if self.settings.on_error != "local" or local is None:
                raise self._unavailable(exc) from None
            return local(self._fall_back(exc))
        except redis.exceptions.RedisClusterException as exc:
            # What the Cluster client raises when no node it knows answers.
            if self.settings.on_error != "local" or local is None:
                raise self._unavailable(exc) from None
            return local(self._fall_back(exc))
        except redis.ResponseError as exc:
            if damaged is not None and _wrong_type(exc):
                repair = damaged

                def again() -> T:
                    repair()
                    return op()

                return self._call(again, local)
            raise StoreError(f"[{_UNREACHABLE}] the Redis store {self.url} refused a command: {_reason(exc)}") from None
        except redis.RedisError as exc:
            raise StoreError(f"[{_UNREACHABLE}] the Redis store {self.url} failed: {_reason(exc)}") from None

    def _answer_again(self) -> None:
        """The start of a new call: a command left unanswered by an earlier prepare does not
        stop this one from asking. One left unanswered outside every prepare (reading the
        session's budget link and checkpoint, as making a session does) still holds for the
        prepare that follows it, within its time: the same call, as a user runs it."""
        unanswered = self._unanswered
        if unanswered is not None and unanswered[2]:
            self._unanswered = None

    def _fall_back(self, exc: object) -> MemoryStore:
        with self._lock:
            if self._local is None:
                self._local = MemoryStore()
                self._local_note = (
                    f"the Redis store {self.url} is unreachable ({exc or type(exc).__name__}); "
                    "on_error=local: this call used an in-memory store and nothing of it was kept"
                )
                _log.warning("store_fallback", url=self.url, error=str(exc))
            return self._local

    @property
    def fell_back(self) -> str | None:
        """Why this store serves the current call from memory (None: it is on Redis)."""
        return self._local_note

    # --- sessions ---------------------------------------------------------------------------

    def session_key(self, name: str) -> str:
        if SESSION_ID_RE.fullmatch(name) and name.strip("."):
            return name
        return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()

    def describe(self, session: str) -> str:
        return f"{self.url}#{session}"

    def _scan(self, pattern: str) -> list[str]:
        """The keys matching ``pattern``; a key that is not UTF-8 is none of ours (ctxrules
        writes none), and is left out rather than failing every listing of the store."""
        found = []
        for key in self._client.scan_iter(match=pattern, count=1000):
            with contextlib.suppress(UnicodeDecodeError):
                found.append(key.decode())
        return found

    def sessions(self) -> list[str]:
        def op() -> list[str]:
            found = set()
            for key in self._scan(PREFIX + "{*}:meta"):
                tag = key[len(PREFIX) + 1 : key.index("}", len(PREFIX))]
                # Ledgers' tags hold a ":"; the store-wide secrets' tag ``{secret}`` has no
                # ``meta``, so a ``{secret}:meta`` is the session "secret"'s (a plain id).
                if ":" not in tag:
                    found.add(tag)
            return sorted(found)

        return self._call(op, lambda m: m.sessions())

    def exists(self, session: str) -> bool:
        return self._call(lambda: bool(self._client.exists(_skey(session, "meta"))), lambda m: m.exists(session))

    def _meta(self, session: str) -> str:
        """The key that makes ``session`` a session (:meth:`exists`, :meth:`sessions`): ``meta``,
        or while :meth:`creating` writes the session, the one kept aside in its place."""
        return _skey(session, _UNMADE_META if session in self._creating else "meta")

    @contextlib.contextmanager
    def creating(self, session: str) -> Iterator[str]:
        """The session's own keys, written without ``meta`` (the marker goes to
        ``creating:meta``, which no listing matches) and under the prepare lock; at the end one
        script renames the marker to ``meta``. What a killed writer left (keys of a session
        without ``meta``, expiring with their TTLs) is removed here first."""
        with self.prepare_lock(session):

            def start() -> None:
                if self._client.exists(_skey(session, "meta")):
                    raise SessionExists(f"{self.describe(session)} exists already")
                self._drop_unmade(session)

            self._call(start)
            self._creating.add(session)
            try:
                yield session
                args = [str(self._ttl_ms), f"{time.time():.6f}"]
                keys = [_skey(session, "meta"), _skey(session, _UNMADE_META)]
                if not self._call(lambda: self._scripts["publish"](keys=keys, args=args)):
                    raise SessionExists(f"{self.describe(session)} exists already")
            except BaseException:
                with contextlib.suppress(Exception):  # the TTLs remove whatever this cannot
                    self._call(lambda: self._drop_unmade(session))
                raise
            finally:
                self._creating.discard(session)
                self.forget(session)

    def _drop_unmade(self, session: str) -> None:
        """Remove the keys of ``session`` when it has no ``meta`` (an unfinished
        :meth:`creating`'s), but its locks'."""
        keep = {_skey(session, p) for p in ("lock", "compaction", "prepares")}
        found = [k for k in self._scan(_skey(session, "*")) if k not in keep]
        if found:
            self._scripts["drop_unmade"](keys=[_skey(session, "meta"), *found], args=[])
        self.forget(session)

    def _touch_commands(self, pipe: Any, session: str, *parts: str) -> None:
        """Mark the session used and push the expiry of ``parts`` (the keys this write touched)
        out by ``ttl_s``; every commit pushes out all of the session's keys."""
        meta = self._meta(session)
        pipe.hset(meta, "used", f"{time.time():.6f}")
        pipe.pexpire(meta, self._ttl_ms)
        for part in parts:
            pipe.pexpire(_skey(session, part), self._ttl_ms)

    def _repair(self, session: str, *also: str) -> list[str]:
        """Remove the keys of ``session`` (and ``also``) holding another Redis type than ctxrules
        writes there; when there were any, the session's turn is reset (docs/stores.md "Damaged
        keys"). Also restarts a damaged revision counter."""
        keys = [_skey(session, p) for p in ("state", "rev")] + [_skey(session, p) for p in _SESSION_REST]
        found = [_text(f) for f in self._scripts["repair"](keys=[*keys, *also], args=[str(self._ttl_ms), "1"])]
        if found:
            _log.warning("store_damaged_keys", url=self.url, session=session, found=found)
        return found

    def _repair_log(self, log: Log) -> list[str]:
        """Remove the keys of ``log`` holding another Redis type (a damaged ledger starts anew)."""
        found = [_text(f) for f in self._scripts["repair"](keys=_log_keys(log), args=[str(self._ttl_ms), "0"])]
        if found:
            _log.warning("store_damaged_keys", url=self.url, ledger=self.log_location(log), found=found)
        return found

    # --- the turn ---------------------------------------------------------------------------

    def _load_args(self, session: str, *, output: bool) -> tuple[list[str], list[str]]:
        """The keys and arguments of the read of the turn: it returns nothing but the revision
        when this object holds that revision."""
        cached = self._cache.get(session)
        holds = cached is not None and cached.state is not None and (cached.output_known or not output)
        keys = [_skey(session, "state"), _skey(session, "rev"), _skey(session, "output")]
        return keys, [str(cached.rev) if holds and cached is not None else "-1", "1" if output else "0"]

    def _evalsha(self, pipe: Any, name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> None:
        pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)

    def _new_call_without_lock(self) -> None:
        """Outside every prepare (no prepare lock held through this object), the start of a call
        that takes none: try Redis again, and drop what the last call kept in memory because Redis
        was unreachable. Else a store fallen back once served every later such call from memory."""
        with self._lock:
            if not self._active:
                self._answer_again()
                if self._local is not None:
                    self._local = self._local_note = None

    def load_turn(self, session: str, *, output: bool = True) -> Turn:
        self._new_call_without_lock()  # a read
        notes: list[str] = []

        def op() -> Turn:
            cached = self._cache.get(session)
            held = self._held.get(session)
            reply = None
            with self._lock:
                early = self._prefetched.pop(session, None)
            # Read when this prepare took the lock (output=False): still the session's turn, since
            # nobody commits without the lock.
            fresh = early is not None and held is not None and early[0] == held.token
            if fresh and early is not None:
                unchanged = early[1][0] == b"=" and cached is not None and cached.output_known
                if not output or unchanged:
                    reply = early[1]
            if reply is None:
                keys, args = self._load_args(session, output=output)
                reply = self._scripts["load"](keys=keys, args=args)
            rev = _revision(reply[1])
            if rev is None:  # a damaged counter: nothing read can be matched to a commit
                with self._lock:
                    self._cache[session] = _Cached(seen=True)
                notes.append(f"the Redis store {self.url} holds a damaged revision of session {session}: recomputed")
                recovered = "the stored revision was unreadable and the session was reset"
                return Turn({"version": STATE_VERSION, "recovered": recovered}, None, notes)
            if reply[0] == b"=" and cached is not None and cached.state is not None:
                # What this object committed or verified last is still the session's turn.
                if held is not None:
                    cached.confirmed = held.token
                return Turn(cached.state, cached.output if output else None, notes)
            raw_state = reply[0]
            if raw_state is None:
                with self._lock:
                    if cached is not None and cached.seen:
                        notes.append(
                            f"the Redis store {self.url} no longer holds session {session} "
                            "(restarted without persistence, flushed, or expired): recomputed from the full history"
                        )
                        _log.warning("store_session_lost", url=self.url, session=session)
                    self._cache[session] = _Cached(seen=False)
                return Turn({"version": STATE_VERSION}, None, notes)
            state = _parse_state(raw_state)
            entry = self._verified(state, rev, reply[2] if len(reply) > 2 else None)
            if held is not None:
                entry.confirmed = held.token
            with self._lock:
                self._cache[session] = entry
            return Turn(state, entry.output if output else None, notes)

        turn = self._call(op, lambda m: m.load_turn(session, output=output), damaged=lambda: self._repair(session))
        if self._local_note is not None:
            turn.notes.append(self._local_note)
        return turn

    def _verified(self, state: dict[str, Any], rev: int, lines: list[bytes] | None) -> _Cached:
        """The cache entry for a turn read from Redis: the output only when it is what the state
        says was written (its count and sha256)."""
        entry = _Cached(rev=rev, state=state, seen=True)
        if lines is None:
            return entry
        entry.output_known = True
        found = state.get("last")
        last: dict[str, Any] = found if isinstance(found, dict) else {}
        digest = hashlib.sha256()
        for line in lines:
            digest.update(line)
            digest.update(b"\n")
        if last.get("output_count") != len(lines) or last.get("output_digest") != digest.hexdigest():
            return entry
        try:
            messages = [json.loads(line) for line in lines]
        except (ValueError, RecursionError):
            return entry
        if not all(isinstance(m, dict) for m in messages):
            return entry
        entry.output, entry.digest = messages, digest
        return entry

    def commit_turn(
        self,
        session: str,
        state: dict[str, Any],
        output: list[dict[str, Any]],
        *,
        records: Sequence[tuple[Sequence[Log], Mapping[str, Any]]] = (),
    ) -> None:
        def op() -> None:
            cached = self._cache.get(session)
            prev = cached.output if cached is not None else None
            append = (
                cached is not None
                and prev is not None
                and cached.digest is not None
                and len(prev) <= len(output)
                and all(a is b for a, b in zip(prev, output, strict=False))
            )
            self._commit(session, state, output, records, cached if append else None)

        self._call(op, lambda m: m.commit_turn(session, state, output, records=records))

    def _commit(
        self,
        session: str,
        state: dict[str, Any],
        output: list[dict[str, Any]],
        records: Sequence[tuple[Sequence[Log], Mapping[str, Any]]],
        base: _Cached | None,
    ) -> None:
        if base is not None and base.output is not None:
            new_lines = [_line(m) for m in output[len(base.output) :]]
            digest = base.digest.copy()
        else:
            new_lines = [_line(m) for m in output]
            digest = hashlib.sha256()
        for line in new_lines:
            digest.update(line)
            digest.update(b"\n")
        state["version"] = STATE_VERSION
        state.pop("recovered", None)
        last = state.setdefault("last", {})
        last["output_count"] = len(output)
        last["output_digest"] = digest.hexdigest()
        last.pop("output_file", None)  # the filesystem store's inode and size mean nothing here
        raw_state = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8")
        held = self._held.get(session)
        token = held.token if held is not None else ""
        if held is not None and held.lost:
            raise StoreError(
                f"[{_LOCK_CODE}] {self.describe(session)}: this worker's prepare lock expired and another "
                "worker may have taken it; the turn was not saved (raise lock_ttl_s if prepares run long)"
            )
        rev, extended = self._commit_script(session, raw_state, new_lines, base.rev if base else None, token)
        if rev == -2:
            # Someone committed since this object's last commit: send the whole output.
            self._cache.pop(session, None)
            lines = [_line(m) for m in output]
            digest = hashlib.sha256(b"".join(line + b"\n" for line in lines))
            last["output_digest"] = digest.hexdigest()
            raw_state = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8")
            rev, extended = self._commit_script(session, raw_state, lines, None, token)
        if rev == -4:
            # No worker holds it: a lease that ran out unclaimed, or a server that restarted or
            # was flushed mid-turn — which took what this turn put in the vault along, so the
            # turn, whose markers name those items, is not saved; the next one recomputes.
            raise StoreError(
                f"[{_LOCK_CODE}] {self.describe(session)}: this worker's prepare lock is gone from the "
                "server (its lease ran out, or the server restarted or was flushed during the turn); the "
                "turn was not saved, and the next turn recomputes from the full history"
            )
        if rev == -1:
            raise StoreError(
                f"[{_LOCK_CODE}] {self.describe(session)}: the prepare lock is held by another worker now "
                "(this worker's lease ran out); the turn was not saved"
            )
        with self._lock:
            entry = _Cached(rev, state, list(output), digest, seen=True, confirmed=token, output_known=True)
            self._cache[session] = entry
        for logs, record in records:
            self._append(logs, record)
        self._maybe_extend_blobs(session, extended)

    def _commit_script(
        self, session: str, raw_state: bytes, lines: list[bytes], append_to: int | None, token: str
    ) -> tuple[int, bytes | None]:
        keys = [*(_skey(session, p) for p in ("state", "output", "rev", "lock")), self._meta(session)]
        keys += [_skey(session, p) for p in _SESSION_PARTS if p not in ("state", "output", "rev", "meta")]
        mode, expect = ("1", str(append_to)) if append_to is not None else ("0", "0")
        args: list[bytes | str] = [raw_state, mode, expect, token, str(self._ttl_ms), f"{time.time():.6f}", *lines]
        reply = self._scripts["commit"](keys=keys, args=args)
        return int(reply[0]), reply[1]

    def output_holds(self, session: str, output: list[dict[str, Any]]) -> bool:
        cached = self._cache.get(session)
        if cached is None or cached.output is None or len(cached.output) != len(output):
            return False
        if not all(a is b for a, b in zip(cached.output, output, strict=True)):
            return False

        held = self._held.get(session)
        if held is not None and not held.lost and cached.confirmed == held.token:
            return True  # read or written under this hold of the lock: nobody else wrote since

        def op() -> bool:
            return _revision(self._client.get(_skey(session, "rev")) or b"0") == cached.rev

        return self._call(op, lambda m: m.output_holds(session, output), damaged=lambda: self._repair(session))

    def forget(self, session: str) -> None:
        with self._lock:
            cached = self._cache.pop(session, None)
            if cached is not None and cached.seen:
                self._cache[session] = _Cached(seen=True)
        if self._local is not None:
            self._local.forget(session)

    def save_state(self, session: str, state: dict[str, Any]) -> None:
        raw = json.dumps(state, ensure_ascii=False, sort_keys=True).encode("utf-8")

        def op() -> None:
            self._repair(session)
            pipe = self._client.pipeline(transaction=True)
            pipe.set(_skey(session, "state"), raw)
            pipe.incr(_skey(session, "rev"))
            self._touch_commands(pipe, session, "state", "rev")
            pipe.execute()
            self.forget(session)

        self._call(op, lambda m: m.save_state(session, state))

    # --- the vault --------------------------------------------------------------------------

    def open_blob_writer(self, session: str) -> SpooledBlobWriter:
        """Pieces spooled to a private local file, stored whole on commit."""
        return SpooledBlobWriter(self, session)

    def put_blob(self, session: str, data: bytes, media_type: str | None = None) -> str:
        data = bytes(data)
        blob_id = hashlib.sha256(data).hexdigest()

        def op() -> str:
            blob = _blob_key(blob_id)
            # The bytes first, then the session's reference to them. One server runs a pipeline
            # in order: one round trip. A Cluster sends a pipeline's commands to their nodes in
            # parallel, so there the bytes go in a round trip of their own, before the reference.
            pipe = self._client.pipeline(transaction=False)
            pipe.set(blob, data, nx=True, ex=self._blob_ttl_s)
            pipe.expire(blob, self._blob_ttl_s, gt=True)  # already there: it lives on
            if self.settings.cluster:
                pipe.execute()
                pipe = self._client.pipeline(transaction=True)
            pipe.sadd(_skey(session, "blobs"), blob_id)
            if media_type is not None:
                pipe.hset(_skey(session, "media"), blob_id, media_type)
            self._touch_commands(pipe, session, "blobs", "media")
            pipe.execute()
            return blob_id

        return self._call(op, lambda m: m.put_blob(session, data, media_type), damaged=lambda: self._repair(session))

    def get_blob(self, session: str, blob_id: str) -> bytes:
        _check_blob_id(blob_id)

        def op() -> bytes:
            pipe = self._client.pipeline(transaction=False)
            pipe.sismember(_skey(session, "blobs"), blob_id)
            pipe.get(_blob_key(blob_id))
            pipe.expire(_blob_key(blob_id), self._blob_ttl_s, gt=True)
            member, data, _ = pipe.execute()
            if not member or data is None:
                why = "the session does not reference it" if not member else "its bytes expired or were removed"
                raise VaultError(f"vault item {blob_id} is missing from {self.describe(session)} (not found: {why})")
            actual = hashlib.sha256(data).hexdigest()
            if actual != blob_id:
                raise VaultError(
                    f"vault entry {blob_id} is corrupt: its content hashes to {actual} ({self.describe(session)})"
                )
            return bytes(data)

        return self._call(op, lambda m: m.get_blob(session, blob_id), damaged=lambda: self._repair(session))

    def has_blob(self, session: str, blob_id: str) -> bool:
        return blob_id not in self.missing_blobs(session, [blob_id])

    def missing_blobs(self, session: str, blob_ids: Sequence[str]) -> set[str]:
        ids = [_check_blob_id(b) for b in blob_ids]
        if not ids:
            return set()

        def op() -> set[str]:
            pipe = self._client.pipeline(transaction=False)
            pipe.smismember(_skey(session, "blobs"), ids)
            for blob_id in ids:
                pipe.exists(_blob_key(blob_id))
            replies = pipe.execute()
            members, present = replies[0], replies[1:]
            return {b for b, m, p in zip(ids, members, present, strict=True) if not m or not p}

        return self._call(op, lambda m: m.missing_blobs(session, ids), damaged=lambda: self._repair(session))

    def blob_ids(self, session: str, prefix: str = "") -> list[str]:
        def op() -> list[str]:
            ids = _vault_ids(self._client.smembers(_skey(session, "blobs")))
            return sorted(i for i in ids if i.startswith(prefix))

        return self._call(op, lambda m: m.blob_ids(session, prefix), damaged=lambda: self._repair(session))

    def blob_media_type(self, session: str, blob_id: str) -> str | None:
        def op() -> str | None:
            value = self._client.hget(_skey(session, "media"), blob_id)
            return value.decode() if value is not None else None

        return self._call(op, lambda m: m.blob_media_type(session, blob_id), damaged=lambda: self._repair(session))

    def _maybe_extend_blobs(self, session: str, extended: bytes | None) -> None:
        """Every ``ttl_s / 2`` of a session's life, push the expiry of every blob it references
        out to twice ``ttl_s`` from now (``EXPIRE GT`` never shortens one another session set)."""
        now = time.time()
        if extended is not None and now - _seconds(extended) < self.settings.ttl_s / 2:
            return
        ids = _vault_ids(self._client.smembers(_skey(session, "blobs")))
        pipe = self._client.pipeline(transaction=False)
        for blob_id in ids:
            pipe.expire(_blob_key(blob_id), self._blob_ttl_s, gt=True)
        pipe.hset(self._meta(session), "blobs_extended", f"{now:.6f}")
        pipe.execute()

    # --- documents --------------------------------------------------------------------------

    def read_doc(self, session: str, name: DocName) -> bytes | None:
        held = self._held.get(session)
        with self._lock:
            early = self._docs_prefetched.get(session)
            if early is not None and held is not None and early[0] == held.token and name in early[1]:
                # Read in the round trip that took this prepare's lock; once (a second read asks).
                return early[1].pop(name)

        def op() -> bytes | None:
            value = self._client.get(_skey(session, f"doc:{name}"))
            return bytes(value) if value is not None else None

        return self._call(op, lambda m: m.read_doc(session, name), damaged=lambda: self._repair(session))

    def update_doc(self, session: str, name: DocName, update: Callable[[bytes | None], bytes | None]) -> None:
        key = _skey(session, f"doc:{name}")
        self._forget_doc(session, name)

        def op() -> None:
            # Optimistic: WATCH the document, compute, MULTI; a writer that got in between makes
            # EXEC fail and the update is computed again from what that writer left.
            with self._client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        pipe.watch(key)
                        current = pipe.get(key)
                        new = update(bytes(current) if current is not None else None)
                        if new is None:
                            pipe.unwatch()
                            return
                        pipe.multi()
                        pipe.set(key, new)
                        self._touch_commands(pipe, session, f"doc:{name}")
                        pipe.execute()
                        return
                    except redis.WatchError:
                        continue

        self._call(op, lambda m: m.update_doc(session, name, update), damaged=lambda: self._repair(session))

    def _forget_doc(self, session: str, name: str) -> None:
        with self._lock:
            early = self._docs_prefetched.get(session)
            if early is not None:
                early[1].pop(name, None)

    def write_doc(self, session: str, name: DocName, data: bytes | None) -> None:
        self._forget_doc(session, name)

        def op() -> None:
            pipe = self._client.pipeline(transaction=True)
            if data is None:
                pipe.delete(_skey(session, f"doc:{name}"))
            else:
                pipe.set(_skey(session, f"doc:{name}"), data)
                self._touch_commands(pipe, session, f"doc:{name}")
            pipe.execute()

        self._call(op, lambda m: m.write_doc(session, name, data), damaged=lambda: self._repair(session))

    def doc_location(self, session: str, name: DocName) -> str:
        return f"{self.describe(session)}/{name}"

    # --- logs -------------------------------------------------------------------------------

    def _append_command(self, pipe: Any, log: Log, record: Mapping[str, Any]) -> None:
        """Queue the commands that append ``record`` to ``log`` in a ``MULTI`` (plain commands, not
        a script: a Cluster pipeline runs no scripts): the record, and the totals as atomic
        counters beside it (a reset record clears them: totals count the calls after the last)."""
        base = _log_base(log)
        line = json.dumps(record, ensure_ascii=False, sort_keys=True, allow_nan=False).encode("utf-8")
        kind = record.get("type")
        pipe.set(base + ":gen", secrets.token_hex(8), nx=True)
        pipe.rpush(base + ":records", line)
        if kind == "reset":
            pipe.delete(base + ":totals")
        elif kind == "call":
            pipe.hincrby(base + ":totals", "calls", 1)
            tokens = record.get("tokens")
            if isinstance(tokens, Mapping):
                for name, value in sorted(tokens.items()):
                    if isinstance(value, int) and not isinstance(value, bool):
                        pipe.hincrby(base + ":totals", f"tokens.{name}", value)
            usd = record.get("usd")
            if isinstance(usd, Mapping):
                for name, value in sorted(usd.items()):
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        pipe.hincrbyfloat(base + ":totals", f"usd.{name}", float(value))
        session_log = log.kind in ("session", "descendants")
        ttl = self._ttl_ms if session_log else self._log_ttl_ms
        if ttl > 0:
            for suffix in (":records", ":totals", ":gen"):
                pipe.pexpire(base + suffix, ttl)
        if session_log:
            self._touch_commands(pipe, log.name)

    def _append(self, logs: Sequence[Log], record: Mapping[str, Any]) -> None:
        if not logs:
            return
        if not self.settings.cluster:
            # One server: one transaction for every log, one round trip.
            self._append_group(logs, record)
            return
        by_slot: dict[str, list[Log]] = {}
        for log in logs:
            by_slot.setdefault(_log_base(log).split("}", 1)[0], []).append(log)
        for group in by_slot.values():  # a Cluster transaction stays on one slot
            self._append_group(group, record)

    def _append_group(self, logs: Sequence[Log], record: Mapping[str, Any], *, again: bool = True) -> None:
        pipe = self._client.pipeline(transaction=True)
        for log in logs:
            self._append_command(pipe, log, record)
        errors = [r for r in pipe.execute(raise_on_error=False) if isinstance(r, Exception)]
        if any(_not_a_number(e) for e in errors):
            # Totals holding a value that is not a number (the other commands, the record's
            # included, went through): removed, so they count from the next record.
            for log in logs:
                self._heal_totals(log)
            errors = [e for e in errors if not _not_a_number(e)]
        if not errors:
            return
        if not again or not all(isinstance(e, redis.ResponseError) and _wrong_type(e) for e in errors):
            raise errors[0]
        # A ledger key of the wrong type (its other commands went through): repaired, and the
        # record appended again to each ledger whose records were removed (it starts anew).
        found = {log: self._repair_log(log) for log in logs}
        if not any(found.values()):
            raise errors[0]
        anew = [log for log, what in found.items() if any(w.split(" was ", 1)[0].endswith("records") for w in what)]
        if anew:
            self._append_group(anew, record, again=False)

    def append(self, logs: Sequence[Log], record: Mapping[str, Any]) -> None:
        self._call(lambda: self._append(logs, record), lambda m: m.append(logs, record))

    def append_once(
        self, log: Log, record: Mapping[str, Any], *, key: str, limit: int
    ) -> Literal["added", "present", "full"]:
        wanted = record.get(key)
        if isinstance(wanted, bool) or not isinstance(wanted, str | int | float):
            raise StoreError(f"append_once: record[{key!r}] must be a string or a number, got {wanted!r}")
        line = json.dumps(dict(record), ensure_ascii=False, sort_keys=True, allow_nan=False).encode("utf-8")
        session_log = log.kind in ("session", "descendants")
        ttl = self._ttl_ms if session_log else self._log_ttl_ms
        args: list[bytes | str] = [
            line,
            key,
            str(wanted),
            "s" if isinstance(wanted, str) else "n",
            str(limit),
            secrets.token_hex(8),
        ]

        def op() -> Literal["added", "present", "full"]:
            got = self._scripts["append_once"](keys=_log_keys(log), args=[*args, str(ttl)])
            outcome = got.decode() if isinstance(got, bytes) else str(got)
            if session_log:
                pipe = self._client.pipeline(transaction=True)
                self._touch_commands(pipe, log.name)
                pipe.execute()
            assert outcome in ("added", "present", "full")
            return outcome  # type: ignore[return-value]

        return self._call(op, lambda m: m.append_once(log, record, key=key, limit=limit))

    def read_log(self, log: Log, cursor: Any = None) -> LogChunk:
        gen, offset = cursor if isinstance(cursor, tuple) and len(cursor) == 2 else ("", 0)
        with self._lock:
            self._logs_read[log] = None
            if len(self._logs_read) > 32:
                del self._logs_read[next(iter(self._logs_read))]
            known = self._log_lengths.get(log)
        if known is not None and self._active:
            token, known_gen, length = known
            # (A log that does not exist reads as generation "" and length 0, cursor or not.)
            if (known_gen, length) == (gen, offset) and any(h.token == token for h in self._held.values()):
                # Unchanged when this prepare took its lock (read in that round trip): a ledger
                # read within one prepare sees the ledgers as of the moment it took the lock.
                return LogChunk([], cursor, False)

        def op() -> LogChunk:
            reply = self._scripts["read_log"](keys=_log_keys(log), args=[gen, str(offset)])
            if reply[2]:
                found = [_text(f) for f in reply[2]]
                _log.warning("store_damaged_keys", url=self.url, ledger=self.log_location(log), found=found)
            new_gen = _text(reply[0])
            lines = [bytes(x) for x in reply[1]]
            restarted = cursor is not None and new_gen != gen
            start = 0 if new_gen != gen else offset
            return LogChunk(lines, (new_gen, start + len(lines)), restarted)

        return self._call(op, lambda m: m.read_log(log, cursor))

    def totals(self, log: Log) -> dict[str, float]:
        """The log's atomic totals since its last reset: ``calls``, ``tokens.<kind>``,
        ``usd.<part>`` (what HINCRBY/HINCRBYFLOAT summed as the records were appended)."""

        def op() -> dict[str, float]:
            raw = self._client.hgetall(_log_base(log) + ":totals")
            if _damaged_totals(raw):
                self._heal_totals(log)
                return {}
            return {k.decode(): float(v) for k, v in raw.items()}

        return self._call(op, lambda m: m.totals(log), damaged=lambda: self._repair_log(log))

    def _heal_totals(self, log: Log) -> None:
        """Remove the totals of ``log`` when a value in them is not a number ctxrules counts
        with (docs/stores.md "Damaged keys"): they count again from the next record."""
        key = _log_base(log) + ":totals"
        bad = _damaged_totals(self._client.hgetall(key))
        if bad:
            self._client.delete(key)
            name, value = bad
            found = [f"{key.split('}:', 1)[1]} held {_text(name)}={_text(value)[:40]!r}"]
            _log.warning("store_damaged_keys", url=self.url, ledger=self.log_location(log), found=found)

    def log_location(self, log: Log) -> str:
        name = f"/{log.name}" if log.name else ""
        return f"{self.url}#ledger/{log.kind}{name}"

    def logs(self, kind: LogKind) -> list[Log]:
        def op() -> list[Log]:
            found: list[Log] = []
            if kind in ("session", "descendants"):
                for key in self._scan(f"{PREFIX}{{*}}:log:{kind}:records"):
                    found.append(Log(kind, key[len(PREFIX) + 1 : key.index("}", len(PREFIX))]))
            elif kind == "misroutes":
                if self._client.exists(_log_base(Log("misroutes")) + ":records"):
                    found.append(Log("misroutes"))
            else:
                head = f"{PREFIX}{{log:{kind}:"
                for key in self._scan(head + "*}:log:records"):
                    found.append(Log(kind, key[len(head) : key.index("}", len(head))]))
            return sorted(found, key=lambda lg: lg.name)

        return self._call(op, lambda m: m.logs(kind))

    # --- locks ------------------------------------------------------------------------------

    def prepare_lock(self, session: str, *, timeout: float | None = None) -> _PrepareLock:
        wait = self.settings.lock_timeout_s if timeout is None else timeout
        return _PrepareLock(self, session, wait)

    def compaction_lock(self, session: str) -> AbstractContextManager[Any]:
        return self._compaction(session)

    @contextlib.contextmanager
    def _compaction(self, session: str) -> Iterator[None]:
        if self._local is not None:
            with self._local.compaction_lock(session):
                yield
            return
        key = _skey(session, "compaction")
        lease = self._acquire(key, wait=0.0)
        if lease is None:
            raise CompactionBusy(f"another compaction of {self.describe(session)} is running")
        try:
            yield
        finally:
            self._release(lease, None, "")

    def _acquire(self, key: str, wait: float, session: str | None = None) -> _Lease | None:
        """Take the lock at ``key``, waiting up to ``wait`` seconds; the lease is renewed in the
        background until released. None when the wait ran out.

        ``session`` (the prepare lock, on one server): the same round trip also reads what the
        prepare asks next — the session's revision (and state, if another worker committed) and
        the length of every ledger this object has read — so that ``load_turn`` and unchanged
        ``read_log`` calls of that prepare need no round trip of their own."""
        with self._lock:
            token = self._doubtful.pop(key, None) or secrets.token_hex(16)
        deadline = time.monotonic() + wait
        pause = 0.002
        prefetch = session is not None and not self.settings.cluster
        keys, args = [key], [token, str(self._lease_ms), str(self._ttl_ms)]
        if session is not None:  # its keys are repaired once the lock is taken
            keys += [_skey(session, p) for p in ("state", "rev", *_SESSION_REST)]
        while True:

            def op() -> list[Any]:
                if not prefetch:  # one script, no pipeline (a Cluster pipeline runs no scripts)
                    return [self._scripts["acquire"](keys=keys, args=args), []]
                pipe = self._client.pipeline(transaction=False)
                # EVALSHA itself, not Script objects: a pipeline of those first asks the server
                # whether it has the scripts (SCRIPT EXISTS), a round trip of its own.
                self._evalsha(pipe, "acquire", keys, args)
                logs: list[Log] = []
                if session is not None:
                    self._evalsha(pipe, "load", *self._load_args(session, output=False))
                    pipe.mget([_skey(session, f"doc:{name}") for name in DOCS])
                    logs = list(self._logs_read)
                    for log in logs:
                        self._evalsha(pipe, "log_length", _log_keys(log), [])
                try:
                    replies: list[Any] = pipe.execute()
                except redis.exceptions.NoScriptError:
                    # A restarted server has no scripts: load them; the next round retries.
                    for script in self._scripts.values():
                        self._client.script_load(script.script)
                    return [None, None, None, []]
                replies.append(logs)
                return replies

            try:
                replies = self._call(op)
            except StoreUnavailable:
                with self._lock:
                    self._doubtful[key] = token  # the SET may have reached the server
                raise
            got = replies[0]
            if got is not None:
                lease = _Lease(key, token, self._lease_ms)
                lease.acquired = got.decode() if isinstance(got, bytes) else str(got)
                if prefetch and session is not None:
                    logs = replies[-1]
                    lengths = replies[3:-1]
                    with self._lock:
                        self._prefetched[session] = (token, replies[1])
                        docs: dict[str, bytes | None] = {
                            name: (bytes(v) if v is not None else None)
                            for name, v in zip(DOCS, replies[2], strict=True)
                        }
                        self._docs_prefetched[session] = (token, docs)
                        for log, (gen, length) in zip(logs, lengths, strict=True):
                            self._log_lengths[log] = (token, _text(gen), int(length))
                self._renew_in_background(lease)
                return lease
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.05)

    def _release(self, lease: _Lease, record_key: str | None, holder: str) -> bool:
        with self._lock:
            self._leases.pop(lease.token, None)
        if lease.pid != os.getpid():
            return False  # the lock of the process this one was forked from (_after_fork)
        keys = [lease.key] if record_key is None else [lease.key, record_key]
        args = [lease.token, lease.acquired, holder, str(_PREPARES_KEPT), str(self._ttl_ms)]
        try:
            return bool(self._call(lambda: self._scripts["release"](keys=keys, args=args)))
        except StoreError as exc:
            # Unreachable now: the lease runs out on its own, or this worker's next take of the
            # lock takes it back; the turn's outcome stands.
            if isinstance(exc, StoreUnavailable):
                with self._lock:
                    self._doubtful[lease.key] = lease.token
            _log.warning("store_unlock_failed", url=self.url, key=lease.key)
            return False

    def _renew_in_background(self, lease: _Lease) -> None:
        with self._lock:
            self._leases[lease.token] = lease
            if self._renewer is None or not self._renewer.alive():
                self._renewer = _Renewer(self)

    def _renew(self, lease: _Lease) -> bool:
        if lease.pid != os.getpid():  # the parent's (_after_fork)
            lease.lost = True
            return False
        ok = bool(self._scripts["renew"](keys=[lease.key], args=[lease.token, str(lease.lease_ms)]))
        if not ok:
            lease.lost = True
        return ok

    def prepares(self, session: str) -> list[tuple[float, float, str]]:
        """When each recent prepare of ``session`` held its lock: ``(acquired, released, holder)``
        in the server's clock, oldest first (the last 1000)."""
        key = _skey(session, "prepares")
        raw = self._call(lambda: self._client.lrange(key, 0, -1), damaged=lambda: self._repair(session))
        out = []
        for item in raw:
            parts = item.decode("utf-8", "replace").split(" ", 2)
            if len(parts) == 3 and not math.isnan(_seconds(parts[0]) + _seconds(parts[1])):
                out.append((_seconds(parts[0]), _seconds(parts[1]), parts[2]))
            # else: an entry ctxrules did not write (a damaged list): not a prepare
        return out

    # --- secrets ----------------------------------------------------------------------------

    def secret(self, session: str | None, name: str, make: Callable[[], bytes]) -> bytes:
        """The secret ``name`` (the injection key), made by ``make`` when the store has none.
        Kept in memory, and checked against the store every :data:`_SECRET_CHECK_S`: a server
        restarted without persistence has lost it, and a worker that kept signing with its
        copy while a new worker made another would no longer recognise the other's tags. The
        copy is put back (the first writer wins, as ever), or the store's value adopted."""
        # The key is what a call asks first: the litellm hook's stateless calls take no lock, and
        # one that found Redis unreachable left every later one writing its vault to memory,
        # where no other worker (nor `vault get`) finds what their markers name.
        self._new_call_without_lock()
        cached = self._secrets.get((session, name))
        now = time.monotonic()
        if cached is not None and now - cached[1] < _SECRET_CHECK_S:
            return cached[0]
        kept = cached[0] if cached is not None else None
        key = _skey(session, f"secret:{name}") if session is not None else f"{PREFIX}{{secret}}:{name}"

        def op() -> bytes:
            # What is there first: ``make`` may refuse to make one (``existing_secret`` asks
            # only for a key the store holds, as a session's own key brought by an import).
            old = self._client.get(key)
            if old is None:
                candidate = kept if kept is not None else make()
                # SET NX GET (Redis 7.0): the first writer's bytes win, and every caller gets them.
                old = self._client.set(key, candidate, nx=True, get=True)
            value = bytes(old) if old is not None else candidate
            if not SECRET_BYTES[0] <= len(value) <= SECRET_BYTES[1]:
                raise self._damaged_secret(key, f"{len(value)} bytes")
            if session is not None:
                self._client.pexpire(key, self._ttl_ms, gt=False)
            return value

        def not_a_string() -> None:
            # The store's own key is no session's to reset: refused as the filesystem store
            # refuses a damaged key file, and named, so that someone can remove it.
            raise self._damaged_secret(key, f"a {_text(self._client.type(key))}")

        repair = (lambda: self._repair(session, key)) if session is not None else not_a_string
        value = self._call(op, lambda m: m.secret(session, name, make), damaged=repair)
        if self._local is None:
            self._secrets[(session, name)] = (value, now)
        return value

    def _damaged_secret(self, key: str, what: str) -> StoreError:
        return StoreError(
            f"[{_UNREACHABLE}] {key} in the Redis store {self.url} is not an injection key ({what}, "
            f"expected {SECRET_BYTES[0]} to {SECRET_BYTES[1]} bytes); delete it to make a new one"
        )

    # --- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.stop()
        if self._made is not None:
            with contextlib.suppress(redis.RedisError):
                self._made.close()

    def __enter__(self) -> RedisStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _seconds(value: bytes | str) -> float:
    """A time ctxrules wrote as a decimal number; NaN for anything else (a damaged value), which
    every comparison treats as not recent."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return math.nan
    return seconds if math.isfinite(seconds) else math.nan


def _wrong_type(exc: Exception) -> bool:
    return "WRONGTYPE" in str(exc)


# What HINCRBY / HINCRBYFLOAT answer for a field that does not hold a number they can add to.
_NOT_A_NUMBER: Final = ("hash value is not an integer", "hash value is not a float", "would overflow", "NaN or Inf")


def _not_a_number(exc: Exception) -> bool:
    return isinstance(exc, redis.ResponseError) and any(words in str(exc) for words in _NOT_A_NUMBER)


def _damaged_totals(raw: Mapping[bytes, bytes]) -> tuple[bytes, bytes] | None:
    """The first field of a ledger's totals whose value is not a finite number (an integer for
    the counters HINCRBY adds to: ``calls``, ``tokens.*``), or None."""
    for name, value in raw.items():
        try:
            number = float(value) if name.startswith(b"usd.") else int(value)
        except ValueError:
            return name, value
        if not math.isfinite(number):
            return name, value
    return None


def _text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")


def _line(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _revision(raw: object) -> int | None:
    """A session's revision counter as stored (``None`` when it is not a decimal integer)."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    return int(text) if text.isdigit() and text.isascii() and len(text) <= 19 else None


def _parse_state(raw: bytes) -> dict[str, Any]:
    """The state as the filesystem store reads it: an unreadable or mistyped one is a new
    session that says why (a cache miss, never a crash later in the turn)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {"version": STATE_VERSION, "recovered": "the stored state was unreadable and was reset"}
    unusable = unusable_state(data)
    if unusable is not None:
        return {"version": STATE_VERSION, "recovered": f"the stored state {unusable} and was reset"}
    return cast(dict[str, Any], data)  # an object: unusable_state said so


class _PrepareLock:
    """The prepare lock of one session on a :class:`RedisStore` (``SET NX PX`` + token)."""

    def __init__(self, store: RedisStore, session: str, wait: float) -> None:
        self.store, self.session, self.wait = store, session, wait
        self._lease: _Lease | None = None
        self._depth = 0
        self._local: Any = None
        self.holder = ""

    def __enter__(self) -> _PrepareLock:
        if self._depth:
            self._depth += 1
            return self
        store = self.store
        with store._lock:
            if not store._active:
                # A new call (a prepare starts with its lock): Redis is tried again, and whatever
                # the last call kept in memory because Redis was unreachable is dropped.
                store._local = store._local_note = None
                store._answer_again()
            store._active += 1
        try:
            lease = None
            if store._local is None:
                try:
                    lease = store._acquire(_skey(self.session, "lock"), self.wait, self.session)
                except _Unreachable as exc:
                    if store.settings.on_error != "local":
                        raise
                    store._fall_back(exc.reason)
            if store._local is not None:
                self._local = store._local.prepare_lock(self.session)
                self._local.__enter__()
                self._depth = 1
                return self
            if lease is None:
                raise StoreLockTimeout(
                    f"[{_LOCK_CODE}] the prepare lock of {store.describe(self.session)} stayed held by another "
                    f"worker for {self.wait:g}s (lock_timeout_s); a worker that died holding it frees it within "
                    f"lock_ttl_s={store.settings.lock_ttl_s:g}s"
                )
        except BaseException:
            with store._lock:
                store._active -= 1
            raise
        self._lease = lease
        # Who held it, for prepares(): this object may be entered by another thread next time.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
        with store._lock:
            store._held[self.session] = lease
        self._depth = 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth:
            return
        with self.store._lock:
            # (Not below 0: a call the forking thread was in is counted no more in a child.)
            self.store._active = max(self.store._active - 1, 0)
        if self._local is not None:
            local, self._local = self._local, None
            local.__exit__(*exc)
            return
        lease, self._lease = self._lease, None
        if lease is None:
            return
        with self.store._lock:
            if self.store._held.get(self.session) is lease:
                del self.store._held[self.session]
        self.store._release(lease, _skey(self.session, "prepares"), self.holder)

    def renew(self) -> None:
        lease = self._lease
        if lease is None:
            return
        if lease.lost or not self.store._call(lambda: self.store._renew(lease)):
            raise StoreError(
                f"[{_LOCK_CODE}] {self.store.describe(self.session)}: the prepare lock was lost to another "
                "worker (its lease ran out)"
            )


@dataclass
class _Renewer:
    """One daemon thread per store that extends every held lease every third of its length, so
    a long compaction keeps its lock while a worker that died loses it within ``lock_ttl_s``."""

    store_ref: weakref.ReferenceType[RedisStore]
    stop_event: threading.Event = field(default_factory=threading.Event)
    pid: int = field(default_factory=os.getpid)
    interval: float = 1.0

    def __init__(self, store: RedisStore) -> None:
        self.store_ref = weakref.ref(store)
        self.stop_event = threading.Event()
        self.pid = os.getpid()
        self.interval = store._lease_ms / 3000
        self.thread = helper_thread(self._run, "ctxrules-redis-lease")
        self.thread.start()

    def alive(self) -> bool:
        # A forked child has the object but not the thread.
        return self.pid == os.getpid() and self.thread.is_alive()

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread is not threading.current_thread() and self.pid == os.getpid():
            self.thread.join(timeout=2)

    def _run(self) -> None:
        while not self.stop_event.wait(self.interval):
            store = self.store_ref()
            if store is None:
                return
            with store._lock:
                leases = list(store._leases.values())
            for lease in leases:
                # Unreachable for now: the next round tries again, the lease may still hold.
                with contextlib.suppress(redis.RedisError):
                    store._renew(lease)
            del store


if TYPE_CHECKING:
    from ctxrules.stores.base import Store

    def _conforms(store: RedisStore) -> Store:
        return store  # mypy checks that RedisStore is a Store
