"""The litellm hook's stateless calls (no session id) on a Redis store with ``on_error=local``:
they take no prepare lock, so nothing marked the start of a call for the store's fallback."""

from __future__ import annotations

import json
from typing import Any

from redis_server import RedisServer

from ctxrules.integrations.litellm import ContextHook
from ctxrules.stores import open_store
from ctxrules.vault import parse_markers


def _history(tag: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for i in range(30):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"i": i})}}
        output = "\n".join(f"{tag} {i}:{n} " + "data " * 12 for n in range(100))
        history += [
            {"role": "user", "content": f"step {i}"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": output},
        ]
    return [*history, {"role": "user", "content": "now fix it"}]


def test_a_stateless_call_after_redis_came_back_keeps_its_vault_in_redis(own_redis: RedisServer) -> None:
    """One stateless call met Redis down and was served from memory, as documented; the calls
    after Redis came back wrote what they elided to that memory too, for ever: their markers
    named vault items no other worker, and no ``vault get``, could read."""
    url = f"{own_redis.url}?on_error=local&connect_timeout_s=0.5"
    hook = ContextHook("builtin:default", store=url, window=16000)
    own_redis.stop()
    down = hook.process({"model": "gpt-4o", "messages": _history("down")}, "openai")
    assert len(json.dumps(down["messages"])) < len(json.dumps(_history("down")))  # served from memory
    own_redis.start()
    out = hook.process({"model": "gpt-4o", "messages": _history("up")}, "openai")
    ids = {m.vault_id for msg in out["messages"] for m in parse_markers(str(msg.get("content") or ""))}
    assert ids
    other_worker = open_store(own_redis.url)
    stateless = other_worker.session_key("stateless")
    for vault_id in ids:
        assert other_worker.get_blob(stateless, vault_id)
