"""Token counts for chat messages and tool schemas, offline, memoized per message.

Tokenizers (chosen by :attr:`ctxrules.models.ModelInfo.tokenizer`)
-------------------------------------------------------------------
``o200k_base`` / ``cl100k_base``
    tiktoken, **exact** for OpenAI models; ``safety_margin`` 0.0. The BPE files are the copies
    the litellm wheel ships in ``litellm/litellm_core_utils/tokenizers/`` (named as tiktoken's
    cache expects): ``TIKTOKEN_CACHE_DIR`` defaults to that directory before tiktoken is first
    imported. If the user points ``TIKTOKEN_CACHE_DIR`` at a directory that lacks the file,
    counting fails with a :class:`~ctxrules.errors.CtxrulesError` instead of downloading:
    this module never touches the network.
``anthropic`` / ``deepseek``
    the ``anthropic_tokenizer.json`` / ``deepseek_tokenizer.json`` files litellm ships, loaded
    with ``tokenizers``. Both are **estimates** (the Anthropic file predates Claude 3; providers
    add template tokens nobody publishes); ``safety_margin`` 0.10.
``approx``
    every other model: cl100k_base counts, labelled an **estimate**; ``safety_margin`` 0.15
    (tokenizers of Gemini, Qwen, Llama, ... differ from cl100k by up to ~15% on code and prose).

``TokenCounter.is_estimate`` says which case applies and ``TokenCounter.padded(n)`` applies the
margin (``n + ceil(n * margin)``) for decisions that must not overflow the window.

Message accounting (the same as ``litellm.token_counter`` for OpenAI models)
-------------------------------------------------------------------------
* 3 tokens per message, plus the tokens of its ``role``, ``content``, ``name`` (+1),
  ``tool_call_id``, ``refusal``, ``reasoning_content``, and of the ``arguments`` string of each
  ``tool_calls[i].function`` (and of a legacy ``function_call``);
* ``reasoning_content`` and the text of ``thinking_blocks`` (``thinking`` blocks; redacted
  blocks are opaque and count 0) count in full: agents send them back to the provider — except
  a ``reasoning_content`` that is exactly the message's thinking texts joined (litellm returns
  Anthropic thinking in both fields): the same text counts once.
* content parts: ``text`` / ``input_text`` / ``output_text`` / ``thinking`` count their text;
  images by the rule below; any other part counts the text of its string fields (``type``,
  ids, ``cache_control`` and ``signature`` excluded), inline payloads (``data:`` URLs, the
  ``data`` of an Anthropic ``base64`` source, an ``input_audio`` part) a flat
  :data:`OPAQUE_MEDIA_TOKENS`; an object typed ``text`` without a ``text`` field (a
  document's plain-text source, ``{"type": "text", "data": ...}``) counts those fields too;
* other fields (``cache_control``, metadata, anything unknown) count nothing;
* a message list costs the sum of its messages plus 3 tokens that prime the reply;
* tool schemas (OpenAI rendering, used for the tiktoken and ``approx`` counters): the
  functions are rendered as a TypeScript ``namespace functions { ... }`` block as OpenAI does
  and counted, plus 9 tokens, minus 4 when the messages carry a system message (the tools go
  into it). Anthropic counters add the 346-token tool-use system prompt to the JSON of the
  schemas; DeepSeek counters add a 222-token template preamble to one JSON line per function.

Strings over :data:`CHUNK_CHARS` characters are encoded in pieces cut where the tokenizer's
own pre-split would cut (after a newline before a letter or digit, else before a single space
between two non-spaces; a hard cut only for text with neither), so pathological inputs stay
linear and the count stays exact.

Where we differ from ``litellm.token_counter`` on purpose: litellm encodes in blind 1024-char
chunks, which adds about one token per chunk (its totals run 0.1-0.4% above the true tiktoken
count on real transcripts; ours are the true count); litellm also counts unknown string fields
and ignores ``thinking_blocks``, and prices a remote image at 85 tokens where we charge the
rule's maximum.

Images
------
* OpenAI rule (every counter except ``anthropic``): ``detail: low`` = 85 tokens. ``high`` /
  ``auto``: fit within 2048x2048, then scale the shortest side down to 768; 170 tokens per
  512x512 tile plus 85. The size is read from the PNG / JPEG / GIF / WebP header of a base64
  ``data:`` URL (no Pillow); an image whose size cannot be read (a remote URL) counts
  :data:`OPENAI_UNKNOWN_IMAGE_TOKENS` = 1445, the most the rule can charge (768x2048 -> 8 tiles).
* Anthropic rule (``anthropic`` counter): the image is scaled so its long edge is at most 1568
  px, then ``ceil(width * height / 750)`` tokens, capped at
  :data:`ANTHROPIC_MAX_IMAGE_TOKENS` = 1600 (about 1.15 megapixels); unknown size counts the cap.

Memoization
-----------
Each counter (one per tokenizer per process) keeps ``message key -> tokens``. The key is built
from the counted fields themselves (strings are hashed once by Python and compared by
identity first), never by serializing the message to JSON, so a message that did not change
is never tokenized again and adding ``cache_control`` or metadata does not invalidate it.
``memo_hits`` / ``memo_misses`` / ``texts_tokenized`` expose the behaviour; the memo is
cleared when it exceeds :data:`MEMO_LIMIT` entries, or when its entries keep more than
:data:`MEMO_CHARS` characters of message text alive (the memos are per process: an agent that
runs for days would otherwise hold every tool output it ever counted, 200,000 of them).
Within one batch of new messages a text that occurs more than once (every ``role``, a file
read twice) is tokenized once.

Inside :func:`trusted_objects` (a session's ``prepare`` runs in it) a second memo is tried first,
by message *object*: a lookup instead of building the key, for lists of hundreds of messages
that several stages count. It notices a new ``content`` or ``tool_calls`` object; an edit deeper
inside a message is noticed by the session, which calls :func:`ctxrules.structure.forget`, and
that empties this memo too. Outside the scope only the key memo is used, so code that edits a
message in place and counts it again always gets the new count.

Texts over the window
---------------------
Inside :func:`token_ceiling` (a session's ``prepare`` runs in it, with the session's window) a
text is tokenized only until its count passes the ceiling; the rest of it counts its UTF-8 byte
length, an upper bound (no token is shorter than a byte). A 50 MB tool result then costs a
window's worth of tokenizing, not 50 MB of it, and every decision taken on the count is on
the safe side: the text is over the window whatever its exact count, and the pipeline spills
it. Such counts are remembered per ceiling, apart from the exact ones. Long texts are tokenized
:data:`GROUP_CHARS` at a time, so the tokenizer's lists of token ids stay small.

Threads
-------
A batch of at least 64K characters (the history of a cold ``prepare``) is tokenized by the
calling thread and up to three helper threads (``ctxrules-tokens``, started for that batch and
gone when it is counted), each taking the next run of neighbouring texts: tiktoken lets go of
the GIL while it encodes. On a busy machine the caller does most runs itself. The counts are the
same whatever the split.

Importing this module is cheap: tiktoken and tokenizers are imported on the first count, and
litellm is never imported.
"""

from __future__ import annotations

import json
import math
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final

from ctxrules import structure
from ctxrules.errors import CtxrulesError
from ctxrules.images import image_size, image_size_from_url
from ctxrules.models import EXACT_TOKENIZERS, ModelInfo, Tokenizer, litellm_package_dir
from ctxrules.scoped import Scoped
from ctxrules.threads import ForkSafeLock, helper_thread

__all__ = [
    "ANTHROPIC_MAX_IMAGE_TOKENS",
    "OPENAI_UNKNOWN_IMAGE_TOKENS",
    "SAFETY_MARGINS",
    "TokenCounter",
    "anthropic_image_tokens",
    "image_size",
    "image_size_from_url",
    "openai_image_tokens",
    "render_openai_functions",
    "token_ceiling",
    "tokenizer_dir",
]

SAFETY_MARGINS: Final[Mapping[str, float]] = {
    "o200k_base": 0.0,
    "cl100k_base": 0.0,
    "anthropic": 0.10,
    "deepseek": 0.10,
    "approx": 0.15,
}

TOKENS_PER_MESSAGE: Final = 3
TOKENS_PER_NAME: Final = 1
REPLY_PRIMING_TOKENS: Final = 3
OPENAI_TOOLS_OVERHEAD: Final = 9
OPENAI_TOOLS_SYSTEM_DISCOUNT: Final = 4
ANTHROPIC_TOOLS_OVERHEAD: Final = 346
DEEPSEEK_TOOLS_OVERHEAD: Final = 222

OPENAI_IMAGE_BASE_TOKENS: Final = 85
OPENAI_IMAGE_TILE_TOKENS: Final = 170
OPENAI_UNKNOWN_IMAGE_TOKENS: Final = 1445
ANTHROPIC_MAX_LONG_EDGE: Final = 1568
ANTHROPIC_PIXELS_PER_TOKEN: Final = 750
ANTHROPIC_MAX_IMAGE_TOKENS: Final = 1600
OPAQUE_MEDIA_TOKENS: Final = 1600

MEMO_LIMIT: Final = 200_000
MEMO_CHARS: Final = 1 << 25
"""Characters of message text (content, tool-call arguments, image data) the memos of one
counter may keep alive, counted roughly (:func:`_chars`); past it they empty. Some 30 times a
1M-token history: a session's own messages are always within it."""
CHUNK_CHARS: Final = 16_384
_BATCH_MIN_AVERAGE: Final = 1_000  # mean characters per text below which texts are encoded in a loop (HF)
_PARALLEL_CHARS: Final = 65_536
"""Characters of texts from which a batch is tokenized on several threads (below, one thread)."""
_RUNS_PER_WORKER: Final = 32
"""A threaded batch is cut into this many runs per worker (see :func:`_in_parallel`)."""
_WORKERS: Final = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
GROUP_CHARS: Final = 1 << 20
"""Characters of a long text handed to the tokenizer at a time."""
BATCH_CHARS: Final = 2 << 20
"""Characters of texts handed to the tokenizer in one batch, at most (one text may be longer)."""
_CHUNK_TARGET: Final = 8_192

_TIKTOKEN_BLOBS: Final[Mapping[str, str]] = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}
_HF_FILES: Final[Mapping[str, str]] = {
    "anthropic": "anthropic_tokenizer.json",
    "deepseek": "deepseek_tokenizer.json",
}

# --------------------------------------------------------------------------- tokenizers

BatchCounter = Callable[[Sequence[str]], list[int]]


def tokenizer_dir() -> Path:
    """The directory of tokenizer files shipped in the litellm wheel."""
    return litellm_package_dir() / "litellm_core_utils" / "tokenizers"


def _load_tiktoken(name: str) -> BatchCounter:
    import hashlib

    directory = tokenizer_dir()
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(directory))
    cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    cache_file = hashlib.sha1(_TIKTOKEN_BLOBS[name].encode()).hexdigest()
    if not cache_dir or not (Path(cache_dir) / cache_file).is_file():
        raise CtxrulesError(
            f"TIKTOKEN_CACHE_DIR={cache_dir!r} has no {name} file ({cache_file}) and ctxrules "
            f"never downloads tokenizers: unset TIKTOKEN_CACHE_DIR to use the copy bundled "
            f"with litellm ({directory}), or copy that file there"
        )
    import tiktoken

    try:
        encoding = tiktoken.get_encoding(name)
    except Exception as exc:  # tiktoken raises plain exceptions for unreadable files
        raise CtxrulesError(f"cannot load the {name} tokenizer from {cache_dir}: {exc}") from exc

    encode = encoding.encode_ordinary

    def count(texts: Sequence[str]) -> list[int]:
        if len(texts) <= 8 or _WORKERS < 2 or sum(map(len, texts)) < _PARALLEL_CHARS:
            return [len(encode(t)) for t in texts]
        return _in_parallel(encode, texts)

    return count


def _in_parallel(encode: Callable[[str], list[int]], texts: Sequence[str]) -> list[int]:
    """``len(encode(t))`` of each text, on up to :data:`_WORKERS` threads (tiktoken lets go of
    the GIL while it encodes). tiktoken's own batch API makes each text a task of a thread pool,
    about 50 us each (20,000 short messages spent seconds submitting tasks); here the texts are
    cut into runs of neighbouring texts, and the calling thread and its helpers take the next
    run until none is left: on a busy machine, where a helper gets no core, the caller does the
    work alone at the cost of a loop, and on an idle one the cores share it."""
    runs: list[Sequence[str]] = []
    # Small runs (about 1/32 of the batch per worker): when every run is taken, the caller waits
    # for the runs its helpers still hold, and a helper the machine did not schedule holds its
    # run the longest; with runs of 1/8 the caller of a cold prepare waited up to 10 ms there.
    share = sum(map(len, texts)) / (_WORKERS * _RUNS_PER_WORKER)
    start, size = 0, 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= share:
            runs.append(texts[start : i + 1])
            start, size = i + 1, 0
    if start < len(texts):
        runs.append(texts[start:])
    counted: list[list[int] | None] = [None] * len(runs)
    pending = iter(range(len(runs)))  # shared: next() on it is atomic under the GIL
    stop: list[bool] = []  # set when the caller stops (an error, KeyboardInterrupt): helpers quit

    def drain() -> None:
        for k in pending:
            if stop:
                return
            counted[k] = [len(encode(t)) for t in runs[k]]

    def helper_drain() -> None:
        # A run that raised is counted again by the caller below, where the error surfaces.
        with suppress(Exception):
            drain()

    # Threads per call, not a kept pool: a kept pool's threads do not survive a fork
    # (pre-forking servers), and starting one costs far less than the work.
    helpers = [helper_thread(helper_drain, "ctxrules-tokens") for _ in range(_WORKERS - 1)]
    for helper in helpers:
        helper.start()
    try:
        drain()
    except BaseException:
        stop.append(True)  # the helpers finish the run they hold, not the whole batch
        raise
    finally:
        for helper in helpers:
            helper.join()
    out: list[int] = []
    for k, counts in enumerate(counted):
        # A run a helper did not finish (it raised) is counted here, where an error surfaces.
        out.extend(counts if counts is not None else [len(encode(t)) for t in runs[k]])
    return out


def _load_hf(kind: str) -> BatchCounter:
    path = tokenizer_dir() / _HF_FILES[kind]
    if not path.is_file():
        raise CtxrulesError(f"the {kind} tokenizer file is missing: {path}")
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tokenizer = HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise CtxrulesError(f"cannot load the {kind} tokenizer {path}: {exc}") from exc

    # encode_batch_fast (tokenizers 0.20 on) leaves out the character offsets, which a count
    # does not need: the same tokens, about 20% sooner. Older releases only have the batch
    # call that makes them. A few short texts (a warm turn's) are encoded in this thread: a
    # batch of any size goes through the tokenizer's thread pool, whose wake-up cost them more.
    batch = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch

    def count(texts: Sequence[str]) -> list[int]:
        size = sum(map(len, texts))
        if len(texts) <= 8 or size < 50_000 or size < _BATCH_MIN_AVERAGE * len(texts):
            return [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
        return [len(e) for e in batch(list(texts), add_special_tokens=False)]

    return count


_LOAD_LOCK = ForkSafeLock()
_BACKENDS: dict[str, BatchCounter] = {}


def _backend(tokenizer: str) -> BatchCounter:
    backend_name = "cl100k_base" if tokenizer == "approx" else tokenizer
    found = _BACKENDS.get(backend_name)
    if found is not None:
        return found
    with _LOAD_LOCK:
        found = _BACKENDS.get(backend_name)
        if found is None:
            if backend_name in _TIKTOKEN_BLOBS:
                found = _load_tiktoken(backend_name)
            elif backend_name in _HF_FILES:
                found = _load_hf(backend_name)
            else:
                raise CtxrulesError(f"unknown tokenizer {tokenizer!r}")
            _BACKENDS[backend_name] = found
        return found


def _split_long(text: str) -> list[str]:
    """Cut ``text`` into pieces of about ``_CHUNK_TARGET`` chars at pre-tokenizer boundaries.

    A cut just after a newline and before a letter or digit, or just before a single space
    between two non-space characters, is a boundary of the o200k / cl100k pre-split,
    so counting the pieces gives the same total; only text without either falls back to a
    hard cut (at most one token of drift per cut).
    """
    return [text[a:b] for a, b in _cuts(text)]


def _cuts(text: str) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` of each piece :func:`_split_long` makes, one at a time."""
    start = 0
    size = len(text)
    while size - start > CHUNK_CHARS:
        limit = start + _CHUNK_TARGET
        floor = start + _CHUNK_TARGET // 4
        cut = -1
        pos = text.rfind("\n", floor, limit)
        while pos != -1:
            if text[pos + 1].isalnum():
                cut = pos + 1
                break
            pos = text.rfind("\n", floor, pos)
        if cut == -1:
            pos = text.rfind(" ", floor, limit)
            while pos != -1:
                if not text[pos - 1].isspace() and not text[pos + 1].isspace():
                    cut = pos
                    break
                pos = text.rfind(" ", floor, pos)
        if cut == -1:
            cut = limit
        yield start, cut
        start = cut
    yield start, size


def _in_batches(counter: BatchCounter, texts: Sequence[str]) -> list[int]:
    """``counter(texts)``, :data:`BATCH_CHARS` of text at a time: the tokenizer returns the
    token ids of a whole batch at once, about 40 bytes per token."""
    if sum(map(len, texts)) <= BATCH_CHARS:
        return counter(texts)
    counts: list[int] = []
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and size + len(text) > BATCH_CHARS:
            counts.extend(counter(batch))
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        counts.extend(counter(batch))
    return counts


def _utf8_length(text: str, start: int) -> int:
    """UTF-8 bytes of ``text[start:]`` (lone surrogates as 3), without encoding it whole."""
    if text.isascii():
        return len(text) - start
    step = 1 << 20
    return sum(len(text[i : i + step].encode("utf-8", "surrogatepass")) for i in range(start, len(text), step))


# --------------------------------------------------------------------------- images


def openai_image_tokens(size: tuple[int, int] | None, detail: str | None = "auto") -> int:
    """OpenAI tile rule (see the module docstring)."""
    if detail == "low":
        return OPENAI_IMAGE_BASE_TOKENS
    if size is None:
        return OPENAI_UNKNOWN_IMAGE_TOKENS
    width, height = size
    scale = min(1.0, 2048 / max(width, height))
    scale *= min(1.0, 768 / (min(width, height) * scale))
    fitted_width = max(1, math.floor(width * scale))
    fitted_height = max(1, math.floor(height * scale))
    tiles = math.ceil(fitted_width / 512) * math.ceil(fitted_height / 512)
    return OPENAI_IMAGE_BASE_TOKENS + OPENAI_IMAGE_TILE_TOKENS * tiles


def anthropic_image_tokens(size: tuple[int, int] | None) -> int:
    """Anthropic pixel rule (see the module docstring)."""
    if size is None:
        return ANTHROPIC_MAX_IMAGE_TOKENS
    width, height = size
    scale = min(1.0, ANTHROPIC_MAX_LONG_EDGE / max(width, height))
    pixels = max(1, math.floor(width * scale)) * max(1, math.floor(height * scale))
    return min(ANTHROPIC_MAX_IMAGE_TOKENS, math.ceil(pixels / ANTHROPIC_PIXELS_PER_TOKEN))


# --------------------------------------------------------------------------- memo keys


class _Tag:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_MAP: Final = _Tag("map")
_SEQ: Final = _Tag("seq")
_TRUE: Final = _Tag("true")
_FALSE: Final = _Tag("false")
_FLOAT: Final = _Tag("float")
_TEXT: Final = _Tag("text")
_IMAGE: Final = _Tag("image")
_JSON: Final = _Tag("json")
_NOT_COUNTED: Final = frozenset({"cache_control"})


class _Exotic(Exception):
    pass


def _freeze(value: object) -> object:
    """A hashable stand-in for a JSON-like value (``cache_control`` keys left out)."""
    kind = type(value)
    if kind is str or value is None or kind is int:
        return value
    if kind is bool:
        return _TRUE if value else _FALSE
    if kind is float:
        return (_FLOAT, value)
    if isinstance(value, Mapping):
        return (_MAP, *((k, _freeze(v)) for k, v in value.items() if k not in _NOT_COUNTED))
    if isinstance(value, list | tuple):
        return (_SEQ, *(_freeze(v) for v in value))
    raise _Exotic


def _hashable(value: object) -> object:
    if value is None or type(value) is str:
        return value
    try:
        return _freeze(value)
    except (_Exotic, RecursionError):
        return (_JSON, json.dumps(value, sort_keys=True, default=repr))


def _part_key(part: object) -> object:
    if type(part) is dict:
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if type(text) is str:
                return (_TEXT, text)
        elif kind == "image_url":
            image = part.get("image_url")
            if type(image) is str:
                return (_IMAGE, image, None)
            if type(image) is dict:
                return (_IMAGE, _hashable(image.get("url")), _hashable(image.get("detail")))
    return _hashable(part)


def _chars(value: object, depth: int = 0) -> int:
    """The characters of the strings in ``value`` (a message), four levels deep at most: what a
    memo entry keeps alive, roughly. Lengths only, no copy. On the path of every message a
    cold prepare counts: a loop that takes strings where it meets them, one call per container
    (an ABC ``isinstance`` and a generator per value were 1.3% of a cold compaction's calls)."""
    kind = type(value)
    if kind is str:
        return len(value)  # type: ignore[arg-type]
    if kind is dict:
        values: Iterable[object] = value.values()  # type: ignore[attr-defined]
    elif kind is list or kind is tuple:
        values = value  # type: ignore[assignment]
    elif isinstance(value, Mapping):
        values = value.values()
    else:
        return 0
    total = 0
    for item in values:
        if type(item) is str:
            total += len(item)
        elif depth < 4 and not isinstance(item, (int, float, bool)) and item is not None:
            total += _chars(item, depth + 1)
    return total


def _message_key(message: Mapping[str, Any]) -> tuple[object, ...]:
    get = message.get
    role = get("role")
    content = get("content")
    if content is not None and type(content) is not str:
        content = tuple([_part_key(p) for p in content]) if type(content) is list else _hashable(content)
    calls = get("tool_calls")
    if calls is not None:
        if type(calls) is list:
            keys: list[object] = []
            for call in calls:
                function = call.get("function") if type(call) is dict else None
                if type(function) is dict:
                    arguments = function.get("arguments")
                    name = function.get("name")
                    call_id = call.get("id")
                    keys.append(
                        (
                            call_id if type(call_id) is str else _hashable(call_id),
                            name if type(name) is str else _hashable(name),
                            arguments if type(arguments) is str else _hashable(arguments),
                        )
                    )
                else:
                    keys.append(_hashable(call))
            calls = tuple(keys)
        else:
            calls = _hashable(calls)
    extra = get("reasoning_content"), get("name"), get("tool_call_id"), get("refusal")
    if any(v is not None and type(v) is not str for v in extra):
        extra = tuple(_hashable(v) for v in extra)  # type: ignore[assignment]
    thinking = get("thinking_blocks")
    function_call = get("function_call")
    return (
        role if role is None or type(role) is str else _hashable(role),
        content,
        calls,
        *extra,
        None if thinking is None else _hashable(thinking),
        None if function_call is None else _hashable(function_call),
    )


# --------------------------------------------------------------------------- accounting


def _repeats_thinking(reasoning: object, message: Mapping[str, Any]) -> bool:
    """``reasoning_content`` that only repeats the message's thinking texts (litellm returns
    Anthropic thinking in both ``reasoning_content`` and ``thinking_blocks``): the provider
    receives the text once, so it is counted once (in the blocks)."""
    if not isinstance(reasoning, str) or not reasoning:
        return False
    texts: list[str] = []
    blocks = message.get("thinking_blocks")
    content = message.get("content")
    for source in (blocks, content):
        if isinstance(source, list):
            texts.extend(
                b["thinking"]
                for b in source
                if isinstance(b, Mapping)
                and b.get("type", "thinking" if source is blocks else None) == "thinking"
                and isinstance(b.get("thinking"), str)
            )
    if not texts or sum(map(len, texts)) > len(reasoning):
        return False
    # litellm joins the texts with ""; other clients with a newline or a blank line.
    return any(reasoning == sep.join(texts) for sep in ("", "\n", "\n\n"))


class _Tally:
    """Tokens of one message: a fixed part plus texts still to be tokenized."""

    __slots__ = ("fixed", "texts")

    def __init__(self) -> None:
        self.fixed = 0
        self.texts: list[str] = []

    def text(self, value: object) -> None:
        if isinstance(value, str):
            if value:
                self.texts.append(value)
        elif value is not None:
            self.texts.append(json.dumps(value, ensure_ascii=False, default=str))


_TEXT_PART_FIELDS: Final[Mapping[str, str]] = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "thinking": "thinking",
}
_OPAQUE_SKIP: Final = frozenset({"type", "id", "tool_use_id", "cache_control", "is_error", "signature", "media_type"})


def _json_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class TokenCounter:
    """Counts tokens with one tokenizer; get one with :meth:`for_model` or :meth:`for_tokenizer`.

    Instances are shared per process and per tokenizer. Counting is thread-safe (the memo
    statistics are best effort).
    """

    _instances: dict[str, TokenCounter] = {}  # noqa: RUF012 - process-wide registry
    _instances_lock = ForkSafeLock()

    def __init__(self, tokenizer: Tokenizer) -> None:
        if tokenizer not in SAFETY_MARGINS:
            raise CtxrulesError(f"unknown tokenizer {tokenizer!r}")
        self.tokenizer: Tokenizer = tokenizer
        self.is_estimate: bool = tokenizer not in EXACT_TOKENIZERS
        self.safety_margin: float = SAFETY_MARGINS[tokenizer]
        self.image_rule: str = "anthropic" if tokenizer == "anthropic" else "openai"
        self.memo_hits = 0
        self.memo_misses = 0
        self.texts_tokenized = 0
        self._memo: dict[tuple[object, ...], int] = {}
        self._by_object: dict[int, tuple[Mapping[str, Any], Any, Any, int]] = {}
        self._by_object_generation = structure.generation()
        self._tools_memo: dict[object, int] = {}
        self._bounds: dict[tuple[object, int | None], int] = {}
        self._count_batch: BatchCounter | None = None
        self._chars = 0  # characters the memos' entries keep alive, roughly (MEMO_CHARS)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> TokenCounter:
        counter = cls._instances.get(tokenizer)
        if counter is None:
            with cls._instances_lock:
                counter = cls._instances.get(tokenizer)
                if counter is None:
                    counter = cls(tokenizer)
                    cls._instances[tokenizer] = counter
        return counter

    @classmethod
    def for_model(cls, info: ModelInfo) -> TokenCounter:
        return cls.for_tokenizer(info.tokenizer)

    def __repr__(self) -> str:
        kind = "estimate" if self.is_estimate else "exact"
        return f"TokenCounter({self.tokenizer!r}, {kind}, margin={self.safety_margin})"

    # -- text ---------------------------------------------------------------------------

    def _batch(self, texts: Sequence[str]) -> list[int]:
        return self._counts(texts)[0]

    def _counts(self, texts: Sequence[str]) -> tuple[list[int], set[int]]:
        """Tokens of each text, and the indexes of those counted as more than the ceiling
        (:func:`token_ceiling`): an upper bound, not their exact count.

        A text that occurs more than once in the batch is tokenized once: every message's
        ``role``, a file read twice, a command run again with the same output (3-4% of a Claude
        Code history's characters, 47% of one OpenHands run's). Their hashes were made for the
        memo keys already, so finding them costs a dict pass."""
        if len(texts) > 8:
            distinct = list(dict.fromkeys(texts))
            if len(distinct) < len(texts):
                counts, over = self._counts_distinct(distinct)
                by_text = dict(zip(distinct, counts, strict=True))
                over_texts = {distinct[i] for i in over}
                bounded = {i for i, t in enumerate(texts) if t in over_texts} if over_texts else set()
                return [by_text[t] for t in texts], bounded
        return self._counts_distinct(texts)

    def _counts_distinct(self, texts: Sequence[str]) -> tuple[list[int], set[int]]:
        """:meth:`_counts` of texts tokenized as they come (duplicates included)."""
        counter = self._count_batch
        if counter is None:
            counter = self._count_batch = _backend(self.tokenizer)
        self.texts_tokenized += len(texts)
        if all(len(t) <= CHUNK_CHARS for t in texts):
            return _in_batches(counter, texts), set()
        # The pieces of a long text up to GROUP_CHARS go into the batch of the short texts: it
        # is counted whole (_count_long counts such a text in one group, never by a bound), and
        # one batch keeps the tokenizer threads busy where a text alone would leave them idle.
        pieces: list[str] = []
        owners: list[int] = []
        longer: list[int] = []
        for i, text in enumerate(texts):
            if len(text) <= CHUNK_CHARS:
                pieces.append(text)
                owners.append(i)
            elif len(text) <= GROUP_CHARS:
                for start, end in _cuts(text):
                    pieces.append(text[start:end])
                    owners.append(i)
            else:
                longer.append(i)
        totals = [0] * len(texts)
        for i, count in zip(owners, _in_batches(counter, pieces), strict=True):
            totals[i] += count
        bounded: set[int] = set()
        ceiling = _CEILING.get()
        for i in longer:
            totals[i], over = self._count_long(counter, texts[i], ceiling)
            if over:
                bounded.add(i)
        return totals, bounded

    @staticmethod
    def _count_long(counter: BatchCounter, text: str, ceiling: int | None) -> tuple[int, bool]:
        """Tokens of a long text, counted :data:`GROUP_CHARS` at a time (the tokenizer's token
        lists for 50 MB of text would take gigabytes); past ``ceiling`` tokens the rest counts
        its UTF-8 byte length (every token is at least one byte), and the flag says so."""
        total = 0
        group: list[str] = []
        size = 0
        for start, end in _cuts(text):
            group.append(text[start:end])
            size += end - start
            if size < GROUP_CHARS and end < len(text):
                continue
            total += sum(counter(group))
            group, size = [], 0
            if ceiling is not None and total > ceiling and end < len(text):
                return total + _utf8_length(text, end), True
        return total, False

    def count_text(self, text: str) -> int:
        """Tokens of a bare string (no message overhead, not memoized); within
        :func:`token_ceiling`, an upper bound for a text over the ceiling."""
        if not text:
            return 0
        return self._batch([text])[0]

    def padded(self, tokens: int) -> int:
        """``tokens`` raised by the declared safety margin."""
        if not self.safety_margin:
            return tokens
        return tokens + math.ceil(round(tokens * self.safety_margin, 6))

    # -- messages -----------------------------------------------------------------------

    def _image(self, url: object, detail: object) -> int:
        size = image_size_from_url(url) if isinstance(url, str) else None
        if self.image_rule == "anthropic":
            return anthropic_image_tokens(size)
        return openai_image_tokens(size, detail if isinstance(detail, str) else "auto")

    def _tally_part(self, part: object, tally: _Tally, depth: int = 0) -> None:
        if isinstance(part, str):
            tally.text(part)
            return
        if not isinstance(part, Mapping):
            if part is not None:
                tally.text(part)
            return
        kind = part.get("type")
        if isinstance(kind, str) and kind in _TEXT_PART_FIELDS:
            text = part.get(_TEXT_PART_FIELDS[kind])
            if text is None:
                # Not a text part: a document's plain-text source, {"type": "text", "data": ...}.
                self._tally_fields(part, tally, depth)
            else:
                tally.text(text)
        elif kind == "redacted_thinking":
            return
        elif kind == "input_audio":
            # The audio's base64 ``data`` (and its ``format``): a payload, not text to tokenize.
            tally.fixed += OPAQUE_MEDIA_TOKENS
        elif kind == "image_url":
            image = part.get("image_url")
            if isinstance(image, Mapping):
                tally.fixed += self._image(image.get("url"), image.get("detail"))
            else:
                tally.fixed += self._image(image, "auto")
        elif kind == "image":
            source = part.get("source")
            url: object = None
            if isinstance(source, Mapping):
                if source.get("type") == "base64":
                    media = source.get("media_type") or "image/png"
                    url = f"data:{media};base64,{source.get('data') or ''}"
                else:
                    url = source.get("url")
            tally.fixed += self._image(url, "auto")
        else:
            # Its fields, not _tally_opaque: that hands an object with a "type" back here, and
            # the two went back and forth 32 times until the object was tokenized as JSON (a
            # document's base64 source, keys and all).
            self._tally_fields(part, tally, depth)

    def _tally_opaque(self, value: object, tally: _Tally, depth: int) -> None:
        if depth > 32:
            tally.text(value)
            return
        if isinstance(value, str):
            if value.startswith("data:"):
                tally.fixed += OPAQUE_MEDIA_TOKENS
            else:
                tally.text(value)
        elif isinstance(value, Mapping):
            if depth and isinstance(value.get("type"), str):
                self._tally_part(value, tally, depth + 1)
                return
            self._tally_fields(value, tally, depth)
        elif isinstance(value, list | tuple):
            for item in value:
                self._tally_opaque(item, tally, depth + 1)

    def _tally_fields(self, value: Mapping[str, Any], tally: _Tally, depth: int) -> None:
        # An Anthropic base64 source ({"type": "base64", "media_type", "data"}: a PDF document)
        # is an inline payload like a data: URL; tokenized as text, a 1 MB PDF counted 700,000
        # tokens and the emergency pass emptied the conversation around it.
        base64 = value.get("type") == "base64"
        for key, item in value.items():
            if key in _OPAQUE_SKIP:
                continue
            if base64 and key == "data" and isinstance(item, str):
                tally.fixed += OPAQUE_MEDIA_TOKENS
            elif key == "input" and isinstance(item, Mapping | list):
                tally.text(_json_text(item))  # tool_use input: sent as JSON
            else:
                self._tally_opaque(item, tally, depth + 1)

    def _tally_message(self, message: Mapping[str, Any]) -> _Tally:
        tally = _Tally()
        tally.fixed = TOKENS_PER_MESSAGE
        tally.text(message.get("role"))
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                self._tally_part(part, tally)
        elif content is not None:
            tally.text(content)
        name = message.get("name")
        if name is not None:
            tally.text(name)
            tally.fixed += TOKENS_PER_NAME
        for field in ("tool_call_id", "refusal"):
            tally.text(message.get(field))
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not _repeats_thinking(reasoning, message):
            tally.text(reasoning)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if not isinstance(call, Mapping):
                    continue
                function = call.get("function")
                if isinstance(function, Mapping):
                    tally.text(function.get("arguments"))
                # An OpenAI custom tool's call sends its free-form ``input`` instead: uncounted,
                # a request of such calls far over the window was reported as fitting.
                custom = call.get("custom")
                if isinstance(custom, Mapping):
                    tally.text(custom.get("input"))
        function_call = message.get("function_call")
        if isinstance(function_call, Mapping):
            tally.text(function_call.get("arguments"))
        blocks = message.get("thinking_blocks")
        if isinstance(blocks, list):
            for block in blocks:
                if isinstance(block, Mapping) and block.get("type", "thinking") == "thinking":
                    tally.text(block.get("thinking"))
        return tally

    def _count_new(self, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], set[int]]:
        """Tokens of each message, and the indexes of those holding a text over the ceiling."""
        tallies = [self._tally_message(m) for m in messages]
        texts = [t for tally in tallies for t in tally.texts]
        counted, over = self._counts(texts) if texts else ([], set())
        counts = iter(counted)
        results = [tally.fixed + sum(next(counts) for _ in tally.texts) for tally in tallies]
        bounded: set[int] = set()
        if over:
            position = 0
            for index, tally in enumerate(tallies):
                if any(position + k in over for k in range(len(tally.texts))):
                    bounded.add(index)
                position += len(tally.texts)
        return results, bounded

    def count_each(self, messages: Iterable[Mapping[str, Any]]) -> list[int]:
        """Tokens of each message (overhead included), from the memo when unchanged."""
        if _TRUSTED.get():
            return self._count_each_trusted(messages)
        return self._count_each(messages)

    def _count_each_trusted(self, messages: Iterable[Mapping[str, Any]]) -> list[int]:
        if self._by_object_generation != structure.generation():
            self._by_object.clear()
            self._by_object_generation = structure.generation()
        by_object = self._by_object
        get = by_object.get
        results: list[int] = []
        missing: list[int] = []
        pending: list[Mapping[str, Any]] = []
        for message in messages:
            hit = get(id(message))
            if (
                hit is not None
                and hit[0] is message
                and hit[1] is message.get("content")
                and hit[2] is message.get("tool_calls")
            ):
                results.append(hit[3])
            else:
                missing.append(len(results))
                pending.append(message)
                results.append(0)
        if pending:
            if len(by_object) + len(pending) > MEMO_LIMIT:
                by_object.clear()
            counts, bounded = self._count_each_bounded(pending)
            for k, (index, message, count) in enumerate(zip(missing, pending, counts, strict=True)):
                results[index] = count
                if k not in bounded:  # a bound holds for one ceiling only: not kept by object
                    self._room(_chars(message))
                    by_object[id(message)] = (message, message.get("content"), message.get("tool_calls"), count)
        self.memo_hits += len(results) - len(missing)
        return results

    def _count_each(self, messages: Iterable[Mapping[str, Any]]) -> list[int]:
        return self._count_each_bounded(messages)[0]

    def _count_each_bounded(self, messages: Iterable[Mapping[str, Any]]) -> tuple[list[int], set[int]]:
        """:meth:`count_each`, and the positions whose count is a bound (:func:`token_ceiling`);
        a bound is remembered with its ceiling, apart from the exact counts."""
        memo = self._memo
        ceiling = _CEILING.get()
        bounds = self._bounds
        bounded: set[int] = set()
        keys: list[tuple[object, ...]] = []
        results: list[int] = []
        missing: list[int] = []
        pending: list[Mapping[str, Any]] = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise CtxrulesError(f"a message must be a JSON object, not {type(message).__name__}")
            key = _message_key(message)
            found = memo.get(key)
            keys.append(key)
            if found is None and bounds and ceiling is not None:
                found = bounds.get((key, ceiling))
                if found is not None:
                    bounded.add(len(results))
            if found is None:
                missing.append(len(results))
                pending.append(message)
                results.append(0)
            else:
                results.append(found)
        self.memo_hits += len(results) - len(missing)
        if pending:
            self.memo_misses += len(pending)
            if len(memo) + len(pending) > MEMO_LIMIT:
                memo.clear()
            counts, over = self._count_new(pending)
            for k, (index, count) in enumerate(zip(missing, counts, strict=True)):
                results[index] = count
                self._room(_chars(pending[k]))
                if k in over:
                    if len(bounds) > 256:
                        bounds.clear()
                    bounds[(keys[index], ceiling)] = count
                    bounded.add(index)
                else:
                    memo[keys[index]] = count
        return results, bounded

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one message, its per-message overhead included."""
        # Stages ask message by message, hundreds of times per run: the object memo first.
        if _TRUSTED.get() and self._by_object_generation == structure.generation():
            hit = self._by_object.get(id(message))
            if (
                hit is not None
                and hit[0] is message
                and hit[1] is message.get("content")
                and hit[2] is message.get("tool_calls")
            ):
                self.memo_hits += 1
                return hit[3]
        return self._count_one(message)

    def _count_one(self, message: Mapping[str, Any]) -> int:
        """:meth:`count_each` of one message, without the list machinery: stages count the
        messages they make one at a time, hundreds per compaction. A message holding a text
        over :data:`CHUNK_CHARS` (which may count by a bound) takes the general path."""
        if not isinstance(message, Mapping):
            return self.count_each([message])[0]  # the error count_each gives
        key = _message_key(message)
        count = self._memo.get(key)
        if count is not None:
            self.memo_hits += 1
        else:
            tally = self._tally_message(message)
            texts = tally.texts
            for text in texts:
                if len(text) > CHUNK_CHARS:
                    return self.count_each([message])[0]
            counter = self._count_batch
            if counter is None:
                counter = self._count_batch = _backend(self.tokenizer)
            self.memo_misses += 1
            self.texts_tokenized += len(texts)
            count = tally.fixed + (sum(counter(texts)) if texts else 0)
            memo = self._memo
            if len(memo) >= MEMO_LIMIT:
                memo.clear()
            self._room(_chars(message))
            memo[key] = count
        if _TRUSTED.get():  # known by its object from now on, as count_each would keep it
            if self._by_object_generation != structure.generation():
                self._by_object.clear()
                self._by_object_generation = structure.generation()
            by_object = self._by_object
            if len(by_object) >= MEMO_LIMIT:
                by_object.clear()
            self._room(_chars(message))
            by_object[id(message)] = (message, message.get("content"), message.get("tool_calls"), count)
        return count

    def count_messages(
        self,
        messages: Iterable[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Prompt tokens: every message, the reply priming, and ``tools`` when given."""
        listed = list(messages)
        total = sum(self.count_each(listed)) + REPLY_PRIMING_TOKENS
        if tools:
            has_system = any(m.get("role") == "system" for m in listed)
            total += self.count_tools(tools, has_system_message=has_system)
        return total

    def remember(self, messages: Sequence[Mapping[str, Any]], counts: Sequence[int]) -> None:
        """Take ``counts[i]`` as the tokens of ``messages[i]`` (overhead included) without
        tokenizing: for counts this counter made earlier for the same messages, which a session
        keeps next to its last output, so that a new process continuing the session does not
        load the tokenizer to count messages it counted before. Like a count, it goes into the
        memo keyed by the counted fields, so only a message with exactly these fields matches."""
        if len(messages) != len(counts):
            raise ValueError(f"{len(messages)} messages but {len(counts)} counts")
        memo = self._memo
        if len(memo) + len(messages) > MEMO_LIMIT:
            memo.clear()
        for message, count in zip(messages, counts, strict=True):
            if isinstance(message, Mapping) and type(count) is int and count >= 0:
                self._room(_chars(message))
                memo.setdefault(_message_key(message), count)

    # -- tools --------------------------------------------------------------------------

    def count_tools(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        has_system_message: bool = False,
    ) -> int:
        """Tokens the tool schemas add to a request (0 for none).

        ``has_system_message``: whether the request's messages include a system message,
        which the OpenAI rendering reuses for the tools (4 tokens less).
        """
        if not tools:
            return 0
        key = (has_system_message, _hashable(list(tools)))
        found = self._tools_memo.get(key)
        if found is not None:
            self.memo_hits += 1
            return found
        self.memo_misses += 1
        functions = list(_function_definitions(tools))
        if self.tokenizer == "anthropic":
            text = "\n".join(_json_text(_anthropic_tool(f)) for f in functions)
            count = ANTHROPIC_TOOLS_OVERHEAD + self.count_text(text) if functions else 0
        elif self.tokenizer == "deepseek":
            text = "\n".join(_json_text(_plain_function(f)) for f in functions)
            count = DEEPSEEK_TOOLS_OVERHEAD + self.count_text(text) if functions else 0
        else:
            discount = OPENAI_TOOLS_SYSTEM_DISCOUNT if has_system_message else 0
            rendered = render_openai_functions(functions)
            count = self.count_text(rendered) + OPENAI_TOOLS_OVERHEAD - discount
        if len(self._tools_memo) > 1024:
            self._tools_memo.clear()
        self._tools_memo[key] = count
        return count

    def clear_memo(self) -> None:
        self._memo.clear()
        self._bounds.clear()
        self._by_object.clear()
        self._tools_memo.clear()
        self._chars = 0

    def _room(self, chars: int) -> None:
        """Make room for an entry keeping ``chars`` characters alive: past :data:`MEMO_CHARS`
        the memos empty (the tools memo holds schemas, few and small: it stays). Inside a
        :func:`trusted_objects` scope (a ``prepare``) they empty when the next outermost scope
        begins, not now: emptied halfway, the rest of the same call counted the whole history
        again, stage after stage (a history past the limit took twice as long)."""
        self._chars += chars
        if self._chars > MEMO_CHARS:
            if _TRUSTED.get():
                _OVER.add(self)
            else:
                self._trim()

    def _trim(self) -> None:
        self._memo.clear()
        self._bounds.clear()
        self._by_object.clear()
        self._chars = 0
        _OVER.discard(self)


_TRUSTED: ContextVar[bool] = ContextVar("ctxrules_trusted_objects", default=False)
_CEILING: ContextVar[int | None] = ContextVar("ctxrules_token_ceiling", default=None)


def token_ceiling(tokens: int | None) -> Scoped[int | None]:
    """Within this scope a text longer than ``tokens`` tokens is not tokenized to its end: it
    counts its exact tokens up to past the ceiling plus the UTF-8 byte length of the rest, an
    upper bound (see the module docstring, "Texts over the window"). A session sets its window:
    such a text can never be sent whole, and only its size over the window matters."""
    return Scoped(_CEILING, tokens)


_OVER: weakref.WeakSet[TokenCounter] = weakref.WeakSet()
"""Counters whose memos passed :data:`MEMO_CHARS` inside a trusted scope (emptied at the next)."""


def trusted_objects() -> Scoped[bool]:
    """Within this scope, messages counted before are known by their object (see the module
    docstring, "Memoization"). For code that does not edit messages in place while inside.
    An outermost scope first empties the memos that grew past :data:`MEMO_CHARS` in an
    earlier one."""
    if _OVER and not _TRUSTED.get():
        for counter in list(_OVER):
            counter._trim()
    return Scoped(_TRUSTED, True)


# --------------------------------------------------------------------------- tool schemas


def _function_definitions(tools: Iterable[object]) -> Iterable[Mapping[str, Any]]:
    """Function definitions from OpenAI, Anthropic or Gemini shaped tool entries."""
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if isinstance(function, Mapping):
            yield function
            continue
        declarations = tool.get("function_declarations") or tool.get("functionDeclarations")
        if isinstance(declarations, list):
            yield from (d for d in declarations if isinstance(d, Mapping))
            continue
        schema = tool.get("input_schema") or tool.get("parameters") or {}
        definition: dict[str, Any] = {"name": tool.get("name"), "parameters": schema}
        if tool.get("description") is not None:
            definition["description"] = tool.get("description")
        yield definition


def _plain_function(function: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": function.get("name")}
    if function.get("description"):
        out["description"] = function.get("description")
    out["parameters"] = function.get("parameters") or {"type": "object", "properties": {}}
    out.update((k, v) for k, v in function.items() if k not in out and k != "description")
    return out


def _anthropic_tool(function: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": function.get("name")}
    if function.get("description"):
        out["description"] = function.get("description")
    out["input_schema"] = function.get("parameters") or {"type": "object", "properties": {}}
    return out


def render_openai_functions(functions: Iterable[Mapping[str, Any]]) -> str:
    """The TypeScript-like block OpenAI models see for function tools."""
    lines = ["namespace functions {", ""]
    for function in functions:
        name = function.get("name")
        if not name:
            continue
        description = function.get("description")
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if description:
            lines.append(f"// {description}")
        if isinstance(parameters, Mapping) and isinstance(properties, Mapping) and properties:
            lines.append(f"type {name} = (_: {{")
            lines.append(_render_properties(parameters, 0))
            lines.append("}) => any;")
        else:
            lines.append(f"type {name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _render_properties(schema: Mapping[str, Any], indent: int) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return ""
    required = schema.get("required")
    required_names = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    rendered: list[str] = []
    for key, prop in properties.items():
        description = prop.get("description") if isinstance(prop, Mapping) else None
        if description:
            rendered.append(f"// {description}")
        optional = "" if key in required_names else "?"
        rendered.append(f"{key}{optional}: {_render_type(prop, indent)},")
    pad = " " * max(0, indent)
    return "\n".join(pad + line for line in rendered)


def _render_type(prop: object, indent: int) -> str:
    if not isinstance(prop, Mapping):
        return "any"
    kind = prop.get("type")
    enum = prop.get("enum")
    if kind == "string" or kind in ("integer", "number"):
        if isinstance(enum, list):
            return " | ".join(f'"{item}"' for item in enum)
        return "string" if kind == "string" else "number"
    if kind == "array":
        return _render_type(prop.get("items"), indent) + "[]"
    if kind == "object":
        return "{\n" + _render_properties(prop, indent + 2) + "\n}"
    if kind == "boolean":
        return "boolean"
    if kind == "null":
        return "null"
    return "any"
