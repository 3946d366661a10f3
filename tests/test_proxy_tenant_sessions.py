"""A session the litellm proxy keeps for a caller's API key (``STATE/keys/<hash>/<id>``,
docs/integrations.md) is the operator's to name on the command line: the budget refusal tells
them to run ``ctxrules usage reset --dimension session``, and its vault items must read back.
Every verb refused that path as "where ctxrules keeps keys"; the tenant's folder and ``keys/``
itself stay refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_kit import cli

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported
litellm = pytest.importorskip("litellm")

PACK = """apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: tenant-budget, version: 1.0.0}
extends: [builtin:default]
budgets:
  session: {tokens: 1000}
  levels:
    exceeded: {refuse: true}
"""


def request(extra: int = 0) -> dict[str, object]:
    output = "\n".join(f"line {i} " + "x" * 60 for i in range(3000))
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": output},
        {"role": "user", "content": "next"},
    ]  # fmt: skip
    for i in range(extra):
        messages += [{"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": f"go on {i}"}]
    return {"model": "gpt-4o", "metadata": {"session_id": "run-1"}, "messages": messages}


def test_a_keyed_proxy_session_can_be_reset_read_and_exported(tmp_path: Path) -> None:
    from ctxrules.integrations.litellm import ContextHook

    (tmp_path / "pack.yaml").write_text(PACK)
    state = tmp_path / "state"
    hook = ContextHook(str(tmp_path / "pack.yaml"), str(state), window=16000)
    out = hook.process(request(), "openai", api_key="sk-user-key")  # as the proxy's hook calls it
    ref = next(w for w in out["messages"][2]["content"].split() if w.startswith("ref=vault://"))
    item = ref.removeprefix("ref=vault://").split("#")[0]
    usage = litellm.ModelResponse(usage={"prompt_tokens": 5000, "completion_tokens": 1, "total_tokens": 5001})
    hook._record({"model": "gpt-4o", "metadata": {"session_id": "run-1", "user_api_key_hash": "sk-user-key"}}, usage)
    with pytest.raises(litellm.RateLimitError, match=r"usage reset --dimension session"):
        hook.process(request(1), "openai", api_key="sk-user-key")
    (session,) = (state / "keys").glob("*/run-1")
    name = str(session.relative_to(tmp_path))

    reset = cli("usage", "reset", "--dimension", "session", "--session", name, "--state", "state", cwd=tmp_path)
    assert reset.returncode == 0, reset.stderr
    hook.process(request(2), "openai", api_key="sk-user-key")  # served again
    got = cli("vault", "get", item, "--session", name, cwd=tmp_path)
    assert got.returncode == 0 and got.stdout.startswith("line 0 "), got.stderr
    exported = cli("sessions", "export", name, "--to", "s.ctxs", "--state", "state", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "s.ctxs").read_text().splitlines()[0])["session"] == "run-1"
    # The folders above a session stay ctxrules' own.
    for own in ("state/keys", str(session.parent.relative_to(tmp_path))):
        refused = cli("usage", "show", "--session", own, "--state", "state", cwd=tmp_path)
        assert refused.returncode == 2 and "is where ctxrules keeps keys" in refused.stderr, (own, refused.stderr)
