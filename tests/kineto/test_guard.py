"""The byte-level JSON guard agrees with a parse of the same text, across any chunking."""

import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from argus.kineto.guard import MAX_JSON_DEPTH, JsonGuard, JsonLimitError

# Strings full of what trips a byte scanner: quotes, backslashes, brackets inside strings.
_TEXT = st.text(alphabet='ab"\\[]{}\u00e9', max_size=12)
_JSON = st.recursive(st.none() | st.integers(-5, 5) | _TEXT,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                     max_leaves=30)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


def _longest(v) -> int:
    """Longest string in the encoded text, in bytes between its quotes (escapes included)."""
    if isinstance(v, str):
        return len(json.dumps(v).encode()) - 2
    if isinstance(v, dict):
        return max([max(_longest(k), _longest(x)) for k, x in v.items()], default=0)
    if isinstance(v, list):
        return max(map(_longest, v), default=0)
    return 0


def _passes(data: bytes, chunk: int, **limits) -> bool:
    guard = JsonGuard(io.BytesIO(data), **limits)
    try:
        while guard.read(chunk):
            pass
    except JsonLimitError:
        return False
    return True


@settings(max_examples=300, derandomize=True, deadline=None)
@given(_JSON, st.integers(1, 9))
def test_depth_and_string_limits_match_the_parsed_value_at_any_chunk_size(value, chunk):
    data = json.dumps(value).encode()
    depth, longest = _depth(value), _longest(value)
    assert _passes(data, chunk, max_depth=max(depth, 1), max_string=longest)
    if depth > 1:
        assert not _passes(data, chunk, max_depth=depth - 1)
    if longest > 0:
        assert not _passes(data, chunk, max_string=longest - 1)


def test_a_deep_event_is_refused_naming_the_byte_and_the_event():
    deep = '{"ph": "X", "args": ' + '{"a": ' * 100 + "1" + "}" * 100 + "}"
    data = ('{"traceEvents": [{"ph": "X"}, ' + deep + "]}").encode()
    guard = JsonGuard(io.BytesIO(data))
    try:
        while guard.read(7):
            pass
        raise AssertionError("not refused")
    except JsonLimitError as exc:
        event_start = data.index(b'{"ph": "X", "args"')
        assert f"deeper than {MAX_JSON_DEPTH} levels" in str(exc)
        assert f"in the trace event starting at byte {event_start:,}" in str(exc)


def test_a_byte_order_mark_is_dropped_and_the_rest_passes_through():
    body = b'{"traceEvents": []}'
    guard = JsonGuard(io.BytesIO(b"\xef\xbb\xbf" + body))
    assert guard.read(2) + guard.read(100) == body


def test_a_byte_order_mark_alone_in_the_first_read_does_not_end_the_stream():
    body = b'{"traceEvents": []}'
    guard = JsonGuard(io.BytesIO(b"\xef\xbb\xbf" + body))
    assert guard.read(3) + guard.read(100) == body
