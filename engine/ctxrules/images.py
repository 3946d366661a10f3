"""Image sizes read from the first bytes of PNG, JPEG, GIF and WebP data (no image library).

Its own module so that stages sizing images (``media.window``) need not import the tokenizer.
"""

from __future__ import annotations

import base64
import binascii
import struct
from typing import Final

__all__ = ["image_size", "image_size_from_url"]

_IMAGE_HEADER_B64_CHARS: Final = 65_536
_IMAGE_MAX_B64_CHARS: Final = 64 * 1024 * 1024


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the header of PNG, JPEG, GIF or WebP bytes; ``None`` if unknown."""
    try:
        size = _image_size(data)
    except (struct.error, IndexError):
        return None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _image_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        if data[12:16] != b"IHDR":
            return None
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk == b"VP8X":  # extended: 24-bit canvas width-1 / height-1
            width = int.from_bytes(data[24:27], "little") + 1
            height = int.from_bytes(data[27:30], "little") + 1
            return width, height
        if chunk == b"VP8 ":  # lossy: key frame start code, then 14-bit sizes
            if data[23:26] != b"\x9d\x01\x2a":
                return None
            width, height = struct.unpack("<HH", data[26:30])
            return int(width) & 0x3FFF, int(height) & 0x3FFF
        if chunk == b"VP8L":  # lossless: signature byte, then 14+14 bits of size-1
            if data[20] != 0x2F:
                return None
            bits = int.from_bytes(data[21:25], "little")
            return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
        return None
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    pos = 2
    end = len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            return None
        (length,) = struct.unpack(">H", data[pos + 2 : pos + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 9 > end:
                return None
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            return int(width), int(height)
        pos += 2 + int(length)
    return None


def _b64decode(payload: str) -> bytes:
    if len(payload) % 4:
        payload = payload[: len(payload) - len(payload) % 4]
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return base64.urlsafe_b64decode(payload)


def image_size_from_url(url: str) -> tuple[int, int] | None:
    """Image size from a base64 ``data:`` URL (reads only the header bytes when it can)."""
    if not url.startswith("data:"):
        return None
    comma = url.find(",", 0, 256)
    if comma < 0 or not url[:comma].lower().endswith(";base64"):
        return None
    payload = url[comma + 1 :]
    if any(c in payload[:_IMAGE_HEADER_B64_CHARS] for c in "\r\n \t"):
        payload = "".join(payload.split())
    if len(payload) > _IMAGE_MAX_B64_CHARS:
        payload = payload[:_IMAGE_MAX_B64_CHARS]
    try:
        size = image_size(_b64decode(payload[:_IMAGE_HEADER_B64_CHARS]))
        if size is None and len(payload) > _IMAGE_HEADER_B64_CHARS:
            size = image_size(_b64decode(payload))  # a JPEG whose frame header comes late
    except (binascii.Error, ValueError):
        return None
    return size
