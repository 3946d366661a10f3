"""``media.window``: a sliding window of visual evidence — images stay in the newest messages.

Agents that look at screenshots (computer use, browsers) append an image on nearly every step;
each costs hundreds to over a thousand tokens and old ones rarely matter. This stage keeps the
images of the newest ``keep_last`` (2) messages that contain any, and replaces every image of an
older message with a marker (one line)::

    [ctxrules:elided kind=image count=1 ref=vault://<sha256 of the raw bytes>
     media_type=image/png bytes=1234 width=64 height=48]

- An inline image (a base64 ``data:`` URL, or an Anthropic-style ``{"type": "image", "source":
  {"type": "base64", ...}}`` part) is decoded and its **raw bytes** go to the vault with their
  media type, so the vault id is the sha256 of the image file itself.
- A remote image (an ``http(s)`` URL) is replaced too (``remote: replace``, the default): the
  URL text goes to the vault and the marker names its host. ``remote: keep`` leaves remote
  images alone (they still count toward the window).
- A ``data:`` URL whose payload does not decode is stored as the URL text.

Pinned and protected messages keep their images (they still count toward the window: an image
in the first user message does not push a newer screenshot out). The image part is replaced by
a text part at the same position; the other parts and fields are kept. A message ctxrules
injected stays its own (signed again: the signature covers its images). Idempotent: a marker is
not an image, so the window is the same on the stage's own output.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

from ctxrules.hookspecs import hookimpl
from ctxrules.images import image_size
from ctxrules.messages import keep_mark
from ctxrules.stages.base import Action, Message, StageOutcome, StageType, unchanged
from ctxrules.stages.filter_common import check_options, tokens_saved
from ctxrules.structure import pinned_indices, shape
from ctxrules.vault import format_marker

if TYPE_CHECKING:
    from ctxrules.pipeline.context import StageContext
    from ctxrules.vault import Vault

__all__ = ["STAGE_TYPE", "MediaWindow", "ctxrules_register_stages", "is_media_part"]

_DATA_URL = re.compile(r"data:(?P<type>[^;,]*)(?P<params>(?:;[^;,]*)*),", re.I)


def is_media_part(part: object) -> bool:
    """An image content part: ``image_url`` (OpenAI) or ``image`` (Anthropic-style)."""
    return isinstance(part, Mapping) and part.get("type") in ("image_url", "image")


class _Image(NamedTuple):
    """What an image part holds: raw bytes (decoded inline data) or a URL."""

    data: bytes | None
    media_type: str | None
    url: str | None
    detail: str | None


def _read(part: Mapping[str, Any]) -> _Image:
    if part.get("type") == "image":
        source = part.get("source")
        if isinstance(source, Mapping):
            if source.get("type") == "base64" and isinstance(source.get("data"), str):
                media = source.get("media_type")
                data = _b64(source["data"])
                if data is not None:
                    return _Image(data, media if isinstance(media, str) else None, None, None)
                return _Image(None, None, str(source["data"]), None)
            if isinstance(source.get("url"), str):
                return _Image(None, None, source["url"], None)
        return _Image(None, None, repr(dict(part)), None)
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    detail = image.get("detail") if isinstance(image, Mapping) else None
    url_text = url if isinstance(url, str) else repr(url)
    detail_text = detail if isinstance(detail, str) else None
    match = _DATA_URL.match(url_text)
    if match is not None and ";base64" in match.group("params").lower():
        data = _b64(url_text[match.end() :])
        if data is not None:
            return _Image(data, match.group("type") or None, None, detail_text)
    return _Image(None, None, url_text, detail_text)


def _b64(payload: str) -> bytes | None:
    cleaned = "".join(payload.split())
    try:
        return base64.b64decode(cleaned, validate=True)
    except (binascii.Error, ValueError):
        try:
            return base64.urlsafe_b64decode(cleaned + "=" * (-len(cleaned) % 4))
        except (binascii.Error, ValueError):
            return None


def _marker(image: _Image, vault: Vault) -> tuple[str, str]:
    """The marker for ``image`` and its vault id (the image is stored first)."""
    fields: dict[str, object] = {}
    if image.data is not None:
        vid = vault.put_bytes(image.data, image.media_type)
        if image.media_type:
            fields["media_type"] = image.media_type
        fields["bytes"] = len(image.data)
        size = image_size(image.data)
        if size is not None:
            fields["width"], fields["height"] = size
    else:
        url = image.url or ""
        vid = vault.put_text(url)
        if url.startswith("data:"):
            fields["source"] = "data_url"  # inline, but its payload did not decode
        elif "://" in url:
            fields["source"] = "url"
            host = urlsplit(url).hostname
            if host:
                fields["host"] = host
        else:
            fields["source"] = "part"  # a part we could not read: kept as its text
    if image.detail:
        fields["detail"] = image.detail
    return format_marker("image", 1, vid, lines=None, **fields), vid


class MediaWindow:
    """The ``media.window`` stage (see the module docstring)."""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        opts = check_options(STAGE_TYPE.name, OPTIONS_SCHEMA, options)
        self.keep_last: int = opts["keep_last"]
        self.remote: str = opts["remote"]

    def __repr__(self) -> str:
        return f"MediaWindow(keep_last={self.keep_last}, remote={self.remote!r})"

    def __call__(self, messages: Sequence[Message], ctx: StageContext) -> StageOutcome:
        with_media = list(shape(messages).where("media"))
        if len(with_media) <= self.keep_last:
            return StageOutcome(messages=unchanged(messages))
        kept = set(with_media[len(with_media) - self.keep_last :]) if self.keep_last else set()
        pins = pinned_indices(messages)
        out = list(messages)
        actions: list[Action] = []
        for index in with_media:
            msg = messages[index]
            if index in kept or index in pins or id(msg) in ctx.protected:
                continue
            new, vault_ids = self._strip(msg, ctx.vault)
            if not vault_ids:
                continue
            new = keep_mark(msg, new)  # an image message ctxrules injected stays its own
            out[index] = new
            actions.append(
                Action(
                    "media_elided",
                    f"message {index}: {len(vault_ids)} image(s) outside the newest {self.keep_last} "
                    "media messages moved to the vault",
                    index=index,
                    tokens_saved=tokens_saved(ctx, msg, new),
                    vault_id=vault_ids[0],
                )
            )
        return StageOutcome(messages=out, actions=actions)

    def _strip(self, msg: Message, vault: Vault) -> tuple[Message, list[str]]:
        parts: list[Any] = []
        vault_ids: list[str] = []
        for part in msg["content"]:
            if not is_media_part(part):
                parts.append(part)
                continue
            image = _read(part)
            remote = image.data is None and "://" in (image.url or "")
            if remote and self.remote == "keep":
                parts.append(part)
                continue
            marker, vid = _marker(image, vault)
            vault_ids.append(vid)
            parts.append({"type": "text", "text": marker})
        return {**msg, "content": parts}, vault_ids


OPTIONS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "title": "media.window options",
    "description": "How many media messages keep their images, and what happens to remote ones.",
    "additionalProperties": False,
    "properties": {
        "keep_last": {
            "title": "Media messages kept",
            "description": (
                "Images stay in the newest this-many messages that contain any; "
                "older images go to the vault, leaving a marker. 0 keeps none "
                "(pinned messages always keep theirs)."
            ),
            "type": "integer",
            "minimum": 0,
            "default": 2,
        },
        "remote": {
            "title": "Remote images",
            "description": (
                "replace: an older image given by URL is replaced by a marker too "
                "(the URL goes to the vault); keep: remote images are left alone."
            ),
            "enum": ["replace", "keep"],
            "default": "replace",
        },
    },
}

STAGE_TYPE = StageType(
    name="media.window",
    phase="content",
    factory=MediaWindow,
    description=(
        "Keeps images only in the newest media messages; older images go to the vault as raw bytes and leave a marker."
    ),
    options_schema=OPTIONS_SCHEMA,
)


@hookimpl
def ctxrules_register_stages(register: Callable[[StageType], None]) -> None:
    register(STAGE_TYPE)
