"""Two REAL litellm proxy replicas (``litellm --config`` with ctxrules' hook) behind one Redis
store, requests alternating between them, send the provider exactly what one proxy alone sends.

One proxy alone on the same server (another database) is the reference; both setups sign with
the same injection key, so the contexts they build can be compared byte for byte at the fake
upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import transcript_paths
from proxy_kit import FakeUpstream, missing_proxy_modules, post, running_proxy, write_config

pytestmark = [
    pytest.mark.corpus,
    pytest.mark.skipif(
        bool(missing_proxy_modules()),
        reason=f'the litellm proxy needs {", ".join(missing_proxy_modules())}: pip install "ctxrules[litellm-proxy]"',
    ),
]

HOOK = """\
from ctxrules.integrations.litellm import ContextHook

hook = ContextHook({pack!r}, store={store!r}, window=16000)
"""
PACK = """\
apiVersion: ctxrules/v1
kind: RulePack
metadata: {name: replicas-test, version: 1.0.0}
extends: [builtin:default]
guards: {max_request_tokens: 400000}
"""
KEY = bytes(range(32))
TRANSCRIPT = "minisweagent-mwaskom__seaborn-3069.json"
TURNS = 4


def _turns() -> list[list[dict[str, Any]]]:
    path = next(p for p in transcript_paths() if p.name == TRANSCRIPT)
    history = json.loads(path.read_text())
    cuts = [i for i, m in enumerate(history) if m.get("role") == "assistant" and i > 0]
    step = (len(cuts) - 1) / (TURNS - 1)
    return [history[: cuts[round(k * step)]] for k in range(TURNS)]


def _proxy_folder(root: Path, name: str, upstream: str, store: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "pack.yaml").write_text(PACK)
    return write_config(folder, upstream, hook=HOOK.format(pack=str(folder / "pack.yaml"), store=store))


def _sent(upstream: FakeUpstream, start: int) -> list[Any]:
    return [body["messages"] for path, body in upstream.requests[start:] if path.endswith("/chat/completions")]


def test_two_proxy_replicas_alternating_send_what_one_proxy_sends(redis_url: str, tmp_path: Path) -> None:
    from ctxrules.stores.redis import RedisStore

    turns = _turns()
    alone = redis_url + "?db=1"
    for url in (redis_url, alone):
        RedisStore.from_url(url).secret(None, "injection.key", lambda: KEY)
    with FakeUpstream(usage_tokens=1000) as upstream:
        one = _proxy_folder(tmp_path, "one", upstream.url, alone)
        a = _proxy_folder(tmp_path, "a", upstream.url, redis_url)
        b = _proxy_folder(tmp_path, "b", upstream.url, redis_url)
        with running_proxy(one) as base:
            start = len(upstream.requests)
            for history in turns:
                status, _ = post(
                    base, "/v1/chat/completions", {"model": "gpt-4o", "messages": history, "litellm_session_id": "s1"}
                )
                assert status == 200
            expected = _sent(upstream, start)
        with running_proxy(a) as base_a, running_proxy(b) as base_b:
            start = len(upstream.requests)
            for i, history in enumerate(turns):
                status, _ = post(
                    (base_a, base_b)[i % 2],
                    "/v1/chat/completions",
                    {"model": "gpt-4o", "messages": history, "litellm_session_id": "s1"},
                )
                assert status == 200
            got = _sent(upstream, start)
    assert len(expected) == len(got) == TURNS
    for i, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine == theirs, f"turn {i}: the replicas sent another context than one proxy"
    store = RedisStore.from_url(redis_url)
    [session] = [s for s in store.sessions() if s.endswith("s1")]
    holds = store.prepares(session)
    assert len({h[2].split(":")[1] for h in holds}) == 2  # both replicas' processes took turns
    store.close()
