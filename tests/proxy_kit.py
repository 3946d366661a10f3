"""A real litellm proxy process in front of a fake upstream, for the integration test and the
proxy benchmark. The upstream (``http.server`` thread on 127.0.0.1) answers OpenAI
``/v1/chat/completions`` and Anthropic ``/v1/messages`` and records every body it receives."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from conftest import REPO

MASTER_KEY = "sk-ctxrules-test-master"
# What `litellm --config` imports at start-up beyond litellm itself (the litellm-proxy extra).
PROXY_MODULES = (
    "fastapi",
    "uvicorn",
    "orjson",
    "backoff",
    "apscheduler",
    "jwt",
    "multipart",
    "redis",
    "semver",
    "expression",
    "fastapi_sso",
    "mcp",
    "soundfile",
    "uvloop",
)


def missing_proxy_modules() -> list[str]:
    return [m for m in PROXY_MODULES if importlib.util.find_spec(m) is None]


class FakeUpstream:
    """Records each POST body; answers like the provider would, with a tiny reply."""

    def __init__(self, usage_tokens: int = 1) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.usage_tokens = usage_tokens
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with upstream._lock:
                    upstream.requests.append((self.path, body))
                if self.path.endswith("/responses"):
                    answer: dict[str, Any] = {
                        "id": "resp_fake",
                        "object": "response",
                        "created_at": 0,
                        "status": "completed",
                        "model": body.get("model"),
                        "output": [
                            {
                                "type": "message",
                                "id": "msg_fake",
                                "status": "completed",
                                "role": "assistant",
                                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
                            }
                        ],
                        "usage": {
                            "input_tokens": upstream.usage_tokens,
                            "output_tokens": 1,
                            "total_tokens": upstream.usage_tokens + 1,
                        },
                    }
                elif self.path.endswith("/messages"):
                    answer = {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "model": body.get("model"),
                        "content": [{"type": "text", "text": "ok"}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": {"input_tokens": upstream.usage_tokens, "output_tokens": 1},
                    }
                else:
                    answer = {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                        ],
                        "usage": {
                            "prompt_tokens": upstream.usage_tokens,
                            "completion_tokens": 1,
                            "total_tokens": upstream.usage_tokens + 1,
                        },
                    }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def litellm_executable() -> str:
    """The ``litellm`` console script of this interpreter's environment."""
    beside = Path(sys.executable).parent / "litellm"
    return str(beside) if beside.exists() else (shutil.which("litellm") or "litellm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(
    folder: Path,
    upstream: str,
    *,
    hook: str | None,
    aliases: Sequence[tuple[str, str] | tuple[str, str, Mapping[str, Any]]] = (),
    router_settings: Mapping[str, Any] | None = None,
) -> Path:
    """A proxy config with an OpenAI and an Anthropic model on ``upstream``; ``hook`` is the
    Python source of ``ctxrules_hook.py`` (the file defines ``hook``), or None for no hook.
    ``aliases``: more deployments, ``(model_name, litellm model)`` or ``(model_name, litellm
    model, more litellm_params)``, on the same upstream (a name given twice is a group of two
    deployments). ``router_settings``: the config's section of that name (``fallbacks``)."""
    lines = ["model_list:"]
    for name, model, *more in (
        ("gpt-4o", "openai/gpt-4o"),
        ("claude-sonnet-4-5", "anthropic/claude-sonnet-4-5"),
        *aliases,
    ):
        base = f"{upstream}/v1" if model.startswith("openai/") else upstream
        params = {"model": model, "api_base": base, "api_key": "sk-fake", **(more[0] if more else {})}
        lines += [f"  - model_name: {name}", f"    litellm_params: {json.dumps(params)}"]
    if hook is not None:
        (folder / "ctxrules_hook.py").write_text(hook)
        lines += ["litellm_settings:", "  callbacks: ctxrules_hook.hook"]
    if router_settings is not None:
        lines += [f"router_settings: {json.dumps(router_settings)}"]  # JSON is YAML
    path = folder / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def running_proxy(
    config: Path, *, timeout_s: float = 120.0, env_extra: Mapping[str, str] | None = None
) -> Iterator[str]:
    """``litellm --config`` on a free port; yields its base URL once /health/liveliness answers.
    ``env_extra``: more environment variables for the proxy."""
    port = free_port()
    env = {
        **os.environ,
        **(env_extra or {}),
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_OFFLINE_MODE": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": str(REPO / "engine"),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "CTXRULES_LOG": "debug",
    }
    log = config.parent / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                litellm_executable(),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=config.parent,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"litellm proxy exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health/liveliness", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"litellm proxy not ready in {timeout_s:.0f} s: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def post(
    base: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 300.0
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {MASTER_KEY}", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            return error.code, json.loads(raw or b"{}")
        except ValueError:
            return error.code, {"raw": raw.decode("utf-8", "replace")}
