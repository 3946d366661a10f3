"""``media.window``: images stay in the newest N media messages; older ones go to the vault as
their raw bytes (real PNGs built with zlib + struct) and leave a marker."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import Any

import pytest
from filtering_kit import Msg, data_url, make_ctx, png_bytes, step, text_of
from invariants import pairing_problems

from ctxrules import Engine
from ctxrules.messages import injected_kind, is_real_user, mark_injected
from ctxrules.stages.media_window import STAGE_TYPE, MediaWindow
from ctxrules.tokens import image_size
from ctxrules.vault import parse_marker, parse_markers

PNGS = [png_bytes(64 + 16 * i, 48 + 8 * i, seed=i) for i in range(5)]


def shot(i: int, text: str = "screenshot", detail: str | None = None) -> Msg:
    image: dict[str, Any] = {"url": data_url(PNGS[i])}
    if detail:
        image["detail"] = detail
    return {
        "role": "user",
        "content": [{"type": "text", "text": f"{text} {i}"}, {"type": "image_url", "image_url": image}],
    }


def screenshots(n: int = 4) -> list[Msg]:
    msgs: list[Msg] = [
        {"role": "system", "content": "You operate a browser."},
        {"role": "user", "content": "Log in to the dashboard."},
    ]
    for i in range(n):
        msgs.extend(step(f"c{i}", f"clicked {i}", "browser", action="click"))
        msgs.append(shot(i))
    msgs.extend(step("last", "done", "browser", action="noop"))
    return msgs


def run(
    messages: list[Msg], tmp_path: Path, options: dict[str, Any] | None = None, **ctx_args: Any
) -> tuple[list[Msg], Any, Any]:
    ctx = make_ctx(tmp_path, **ctx_args)
    outcome = MediaWindow(options)(messages, ctx)
    return outcome.messages, outcome, ctx


def images(msg: Msg) -> int:
    content = msg.get("content")
    return sum(1 for p in content if p.get("type") in ("image_url", "image")) if isinstance(content, list) else 0


def test_only_the_newest_two_media_messages_keep_their_images(tmp_path: Path) -> None:
    messages = screenshots(4)
    out, outcome, ctx = run(messages, tmp_path)
    with_images = [i for i, m in enumerate(out) if images(m)]
    assert with_images == [10, 13]  # the newest two screenshots
    assert [a.index for a in outcome.actions] == [4, 7]
    for action, n in zip(outcome.actions, (0, 1), strict=True):
        msg = out[action.index]
        assert msg["content"][0] == {"type": "text", "text": f"screenshot {n}"}  # order kept
        marker = parse_marker(msg["content"][1]["text"])
        assert marker.kind == "image" and marker.count == 1
        # The vault id is the sha256 of the raw PNG bytes, and the bytes come back exactly.
        assert marker.vault_id == hashlib.sha256(PNGS[n]).hexdigest() == action.vault_id
        assert ctx.vault.get(marker.vault_id) == PNGS[n]
        assert ctx.vault.media_type(marker.vault_id) == "image/png"
        assert image_size(ctx.vault.get(marker.vault_id)) == (64 + 16 * n, 48 + 8 * n)
        assert marker.extra["width"] == str(64 + 16 * n)
        assert marker.extra["bytes"] == str(len(PNGS[n]))
        assert action.tokens_saved > 0


def test_keep_last_is_an_option(tmp_path: Path) -> None:
    messages = screenshots(4)
    out, _, _ = run(messages, tmp_path / "a", {"keep_last": 3})
    assert [i for i, m in enumerate(out) if images(m)] == [7, 10, 13]
    out, _, _ = run(messages, tmp_path / "b", {"keep_last": 0})
    assert [i for i, m in enumerate(out) if images(m)] == [13]  # the latest user message is pinned


def test_pinned_images_stay_and_count_toward_the_window(tmp_path: Path) -> None:
    messages = screenshots(3)
    messages[1] = shot(4, "Here is the design")  # the human anchor, with an image
    out, outcome, _ = run(messages, tmp_path)
    assert out[1] is messages[1]
    assert [a.index for a in outcome.actions] == [4]  # 7 and 10 are the newest two


def test_protected_messages_keep_their_images(tmp_path: Path) -> None:
    messages = screenshots(4)
    out, outcome, _ = run(messages, tmp_path, protected=[id(messages[4])])
    assert out[4] is messages[4] and [a.index for a in outcome.actions] == [7]


def test_an_injected_message_stays_injected_when_its_images_leave(tmp_path: Path) -> None:
    """The signature of an injected message covers its images: the stage signs the message
    again, or a plugin's injected screenshot would read as a real user message."""
    ours = mark_injected(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(PNGS[4])}}]}, "shot"
    )
    messages = screenshots(4)
    messages.insert(2, ours)  # after the anchor, before the first step
    out, outcome, _ctx = run(messages, tmp_path)
    assert 2 in [a.index for a in outcome.actions]
    assert not images(out[2]) and parse_markers(text_of(out[2]))
    assert injected_kind(out[2]) == "shot" and not is_real_user(out[2])


def test_remote_images_are_replaced_by_default_and_kept_on_request(tmp_path: Path) -> None:
    url = "https://cdn.example.com/shots/1.png?sig=abc"
    messages = screenshots(3)
    messages[4] = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
    out, outcome, ctx = run(messages, tmp_path)
    marker = parse_marker(out[4]["content"][0]["text"])
    assert marker.extra == {"source": "url", "host": "cdn.example.com"}
    assert ctx.vault.get_text(marker.vault_id) == url
    out, outcome, _ = run(messages, tmp_path, {"remote": "keep"})
    assert out[4] is messages[4] and outcome.actions == []


def test_undecodable_inline_data_is_stored_as_its_url_text(tmp_path: Path) -> None:
    bad = "data:image/png;base64,@@@not-base64@@@"
    messages = screenshots(3)
    messages[4] = {"role": "user", "content": [{"type": "image_url", "image_url": bad}]}
    out, _, ctx = run(messages, tmp_path)
    marker = parse_marker(out[4]["content"][0]["text"])
    assert marker.extra["source"] == "data_url"
    assert ctx.vault.get_text(marker.vault_id) == bad


def test_anthropic_style_image_parts_and_tool_results_with_images(tmp_path: Path) -> None:
    import base64

    messages = screenshots(2)
    anthropic_part = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNGS[3]).decode()},
    }
    messages[6] = {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "clicked 1"}, anthropic_part],
    }
    messages.insert(4, {"role": "user", "content": [anthropic_part]})  # another media message
    assert pairing_problems(messages) == []
    out, outcome, ctx = run(messages, tmp_path)
    assert [a.index for a in outcome.actions] == [4, 5]
    marker = parse_marker(out[4]["content"][0]["text"])
    assert ctx.vault.get(marker.vault_id) == PNGS[3] and marker.extra["media_type"] == "image/png"
    assert images(out[7]) == 1  # the tool result's screenshot is among the newest two


def test_detail_is_recorded_in_the_marker(tmp_path: Path) -> None:
    messages = screenshots(3)
    messages[4] = shot(0, detail="low")
    out, _, _ = run(messages, tmp_path)
    assert parse_markers(text_of(out[4]))[0].extra["detail"] == "low"


def test_input_not_mutated_unchanged_messages_are_the_same_objects_and_rerun_is_a_no_op(tmp_path: Path) -> None:
    messages = screenshots(5)
    frozen = copy.deepcopy(messages)
    ctx = make_ctx(tmp_path)
    stage = MediaWindow({})
    out = stage(messages, ctx).messages
    assert messages == frozen
    changed = {i for i, (a, b) in enumerate(zip(messages, out, strict=True)) if a is not b}
    assert changed == {4, 7, 10}
    again = stage(out, ctx)
    assert again.actions == [] and all(a is b for a, b in zip(out, again.messages, strict=True))


def test_through_the_engine_with_a_pack(tmp_path: Path) -> None:
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "extends: [builtin:default]\n"
        "pipeline:\n  - {id: media, with: {keep_last: 1}}\n"
    )
    session = Engine.load(pack).session(tmp_path / "s", model="gpt-4o")
    history = screenshots(3)
    result = session.prepare(history)
    media = next(s for s in result.report["stages"] if s["id"] == "media")
    assert [a["index"] for a in media["actions"]] == [4, 7]
    assert media["tokens_saved"] > 0
    assert pairing_problems(result.messages) == []
    for action in media["actions"]:
        assert session.vault.get(action["vault_id"]) in PNGS


def test_builtin_default_keeps_two(tmp_path: Path) -> None:
    session = Engine.load("builtin:default").session(tmp_path / "s", model="gpt-4o")
    result = session.prepare(screenshots(4))
    assert [i for i, m in enumerate(result.messages) if images(m)] == [10, 13]


def test_options_are_checked(tmp_path: Path, cli: Any) -> None:
    with pytest.raises(ValueError, match="keep_last"):
        MediaWindow({"keep_last": -1})
    for name, prop in STAGE_TYPE.options_schema["properties"].items():
        assert prop.get("title") and prop.get("description"), name
    pack = tmp_path / "pack.yaml"
    pack.write_text(
        "apiVersion: ctxrules/v1\nkind: RulePack\nmetadata: {name: t, version: 1.0.0}\n"
        "pipeline:\n  - {id: media, use: media.window, with: {keep: 2}}\n"
    )
    code, out, err = cli("validate", str(pack))
    assert code == 1 and "CR061" in out + err and "keep_last" in out + err
