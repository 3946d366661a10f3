"""Semantic versions and the range syntax of ``extends: builtin:NAME@RANGE`` and ``requires``."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxrules.packs.semver import RangeError, Version, is_semver, parse_range, parse_version


def ok(rng: str, version: str) -> bool:
    return parse_range(rng).contains(version)


# -- versions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "0.0.0",
        "1.2.3",
        "10.20.30",
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-0.3.7",
        "1.0.0-x.7.z.92",
        "1.0.0+build.1",
        "1.0.0-rc.1+meta",
    ],
)
def test_valid_semver(text: str) -> None:
    assert is_semver(text)
    parse_version(text)


@pytest.mark.parametrize(
    "text",
    [
        "1",
        "1.0",
        "1.0.0.0",
        "01.0.0",
        "1.02.0",
        "v1.0.0",
        "1.0.0-",
        "1.0.0-01",
        "1.0.0+",
        "a.b.c",
        "",
        " 1.0.0x",
        "1.0.0-a..b",
    ],
)
def test_invalid_semver(text: str) -> None:
    assert not is_semver(text)
    with pytest.raises(RangeError):
        parse_version(text)


@pytest.mark.parametrize("value", [None, 1, 1.0, ["1.0.0"]])
def test_is_semver_takes_anything(value: object) -> None:
    assert not is_semver(value)


def test_precedence_from_the_semver_spec() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
    ]
    versions = [parse_version(v) for v in ordered]
    assert sorted(reversed(versions)) == versions
    for a, b in itertools.pairwise(versions):
        assert a < b and a <= b and not b < a


def test_build_metadata_does_not_order() -> None:
    keys = {parse_version(v).key() for v in ("1.0.0+a", "1.0.0+b", "1.0.0")}
    assert len(keys) == 1
    assert str(parse_version("1.2.3-rc.1+x")) == "1.2.3-rc.1"


# -- ranges --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rng", "inside", "outside"),
    [
        # caret: changes that keep the leftmost non-zero part
        ("^1.2.3", ["1.2.3", "1.2.4", "1.9.0", "1.99.99"], ["1.2.2", "2.0.0", "2.0.0-0", "2.0.0-rc.1", "0.9.9"]),
        ("^1", ["1.0.0", "1.5.2"], ["0.9.9", "2.0.0"]),
        ("^1.2", ["1.2.0", "1.3.0"], ["1.1.9", "2.0.0"]),
        ("^0.2.3", ["0.2.3", "0.2.9"], ["0.3.0", "0.2.2", "1.0.0"]),
        ("^0.0.3", ["0.0.3"], ["0.0.4", "0.0.2", "0.1.0"]),
        ("^0.0", ["0.0.0", "0.0.9"], ["0.1.0"]),
        ("^0", ["0.0.0", "0.9.9"], ["1.0.0"]),
        # tilde: patch changes (minor ones when only the major is given)
        ("~1.2.3", ["1.2.3", "1.2.9"], ["1.3.0", "1.2.2"]),
        ("~1.2", ["1.2.0", "1.2.9"], ["1.3.0", "1.1.0"]),
        ("~1", ["1.0.0", "1.9.0"], ["2.0.0", "0.9.0"]),
        ("~0.2", ["0.2.0", "0.2.5"], ["0.3.0"]),
        # wildcards
        ("*", ["0.0.0", "1.2.3", "99.0.0"], []),
        ("x", ["0.1.0"], []),
        ("1.x", ["1.0.0", "1.9.9"], ["2.0.0", "0.9.9"]),
        ("1.2.x", ["1.2.0", "1.2.7"], ["1.3.0"]),
        ("1.2.*", ["1.2.7"], ["1.3.0"]),
        ("1.X", ["1.4.0"], ["2.0.0"]),
        ("1", ["1.0.0", "1.9.9"], ["2.0.0"]),
        ("1.2", ["1.2.0", "1.2.9"], ["1.3.0"]),
        # comparators and exact versions
        ("1.2.3", ["1.2.3"], ["1.2.4", "1.2.3-rc.1"]),
        ("=1.2.3", ["1.2.3"], ["1.2.2"]),
        ("==1.2.3", ["1.2.3"], ["1.2.2"]),
        ("v1.2.3", ["1.2.3"], ["1.2.2"]),
        (">=0.1", ["0.1.0", "0.1.1", "5.0.0"], ["0.0.9"]),
        (">= 0.1", ["0.1.0"], ["0.0.9"]),
        (">1.2.3", ["1.2.4", "2.0.0"], ["1.2.3"]),
        (">1", ["2.0.0"], ["1.9.9", "1.0.0"]),
        (">1.2", ["1.3.0"], ["1.2.9"]),
        ("<2", ["1.9.9"], ["2.0.0", "2.0.0-rc.1"]),
        ("<1.2", ["1.1.9"], ["1.2.0", "1.2.0-beta"]),
        ("<1.2.3", ["1.2.2"], ["1.2.3"]),
        ("<=1.2.3", ["1.2.3"], ["1.2.4"]),
        ("<=1.2", ["1.2.9"], ["1.3.0"]),
        ("<=1", ["1.9.9"], ["2.0.0"]),
        # conjunctions (space or comma) and alternatives
        (">=0.1,<2", ["0.1.0", "1.9.9"], ["2.0.0", "0.0.1"]),
        (">=0.1 <2", ["1.0.0"], ["2.0.0"]),
        (">=1.0.0, <1.5.0", ["1.4.9"], ["1.5.0"]),
        ("^1 || ^3", ["1.2.0", "3.0.0"], ["2.0.0", "4.0.0"]),
        ("<1 || >=2 <3 || 5.x", ["0.5.0", "2.5.0", "5.1.0"], ["1.5.0", "3.0.0", "4.0.0"]),
        # pre-releases sort before their release
        (">=1.0.0-rc.1", ["1.0.0-rc.1", "1.0.0-rc.2", "1.0.0"], ["1.0.0-beta", "0.9.0"]),
        ("^1.0.0-beta.2", ["1.0.0-beta.2", "1.0.0-beta.11", "1.0.0", "1.5.0"], ["1.0.0-beta.1", "2.0.0-0"]),
        ("<1.0.0", ["1.0.0-rc.1", "0.9.0"], ["1.0.0"]),
        # build metadata is ignored
        ("1.2.3+build.5", ["1.2.3", "1.2.3+other"], ["1.2.4"]),
    ],
)
def test_range(rng: str, inside: list[str], outside: list[str]) -> None:
    for v in inside:
        assert ok(rng, v), f"{v} should be in {rng}"
    for v in outside:
        assert not ok(rng, v), f"{v} should not be in {rng}"


def test_engine_style_versions_are_accepted() -> None:
    r = parse_range(">=0.1")
    assert r.contains("0.1") and r.contains("0.1.0") and r.contains("1.0.0+local")
    assert r.contains(Version(0, 2, 0))
    assert str(r) == ">=0.1"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "banana",
        "^^1",
        ">=one.two",
        "1.2.3 -",
        "1 ||",
        "|| 1",
        ">=*",
        ">x",
        "~>1.2",
        "1.2.3.4",
        "^",
        ">=",
        "1..2",
        "=>1",
    ],
)
def test_unparsable_ranges(bad: str) -> None:
    with pytest.raises(RangeError) as info:
        parse_range(bad)
    assert str(info.value)


def test_contains_refuses_a_non_version() -> None:
    with pytest.raises(RangeError):
        parse_range("^1").contains("latest")


# -- properties ----------------------------------------------------------------------------

_num = st.integers(0, 30)
_pre = st.lists(st.one_of(st.integers(0, 5), st.sampled_from(["alpha", "beta", "rc"])), max_size=2)
_versions = st.builds(lambda a, b, c, p: Version(a, b, c, tuple(p)), _num, _num, _num, _pre)


def _next_breaking(v: Version) -> Version:
    if v.major:
        return Version(v.major + 1, 0, 0, (0,))
    if v.minor:
        return Version(0, v.minor + 1, 0, (0,))
    return Version(0, 0, v.patch + 1, (0,))


@settings(max_examples=300, deadline=None)
@given(base=_versions, v=_versions)
def test_caret_is_at_least_base_and_below_the_next_breaking_one(base: Version, v: Version) -> None:
    expected = base <= v and v < _next_breaking(base)
    assert parse_range(f"^{base}").contains(v) is expected


@settings(max_examples=300, deadline=None)
@given(base=_versions, v=_versions)
def test_tilde_is_at_least_base_and_below_the_next_minor(base: Version, v: Version) -> None:
    expected = base <= v and v < Version(base.major, base.minor + 1, 0, (0,))
    assert parse_range(f"~{base}").contains(v) is expected


@settings(max_examples=300, deadline=None)
@given(a=_versions, b=_versions, v=_versions)
def test_comparators_agree_with_ordering_and_combine(a: Version, b: Version, v: Version) -> None:
    assert parse_range(f">={a}").contains(v) is (a <= v)
    assert parse_range(f">{a}").contains(v) is (a < v)
    assert parse_range(f"<{a}").contains(v) is (v < a)
    assert parse_range(f"<={a}").contains(v) is (v <= a)
    assert parse_range(f"={a}").contains(v) is (v.key() == a.key())
    assert parse_range(f">={a} <{b}").contains(v) is (a <= v and v < b)
    assert parse_range(f">={a},<{b}").contains(v) is (a <= v and v < b)
    assert parse_range(f"<{a} || >{b}").contains(v) is (v < a or b < v)


@settings(max_examples=300, deadline=None)
@given(a=_versions, b=_versions, c=_versions)
def test_ordering_is_a_total_order(a: Version, b: Version, c: Version) -> None:
    assert (a < b) + (b < a) + (a.key() == b.key()) == 1
    if a <= b and b <= c:
        assert a <= c
    assert parse_version(str(a)).key() == a.key()


@settings(max_examples=200, deadline=None)
@given(major=_num, minor=_num, v=_versions)
def test_wildcards_match_their_prefix(major: int, minor: int, v: Version) -> None:
    # a pre-release of the first version in the prefix sorts before it, so it is outside
    in_major = v.major == major and not (v.pre and v.key() < Version(major, 0, 0).key())
    assert parse_range(f"{major}.x").contains(v) is in_major
    first = Version(major, minor, 0).key()
    in_minor = (v.major, v.minor) == (major, minor) and not (v.pre and v.key() < first)
    assert parse_range(f"{major}.{minor}.x").contains(v) is in_minor
    assert parse_range("*").contains(v)
