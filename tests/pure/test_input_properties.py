"""Property tests of the readers that take untrusted input (issue 16 item 8, S-SEC-2).

Row files, ``key=value`` overrides, the ``_SUCCESS`` marker and the latest pointer
come from users, other tools or a disk that was cut off mid-write. Whatever they
hold, each reader either accepts it or refuses it with the project's own error type
(RowReadError with row/line/column, ConfigError naming the key, CheckpointError
naming the file): never a UnicodeDecodeError, KeyError, zlib or json error that
names nothing. Inputs are generated as valid documents and then damaged (truncated,
bytes flipped, ``}{`` joins, BOMs, NUL, invalid UTF-8, gzip of those, gzip cut
short), so the examples reach the interesting branches, not just the first byte
check. The examples are derandomized (tests/conftest.py) so CI is reproducible.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from checkpoint.boundary import CheckpointError, read_latest, read_marker
from configs.loading import ConfigError, _section_model, apply_overrides, load_config, load_profile, parse_override
from configs.schema import PPOConfig
from data.row_reader import RowReadError, iter_rows

TINY_PROFILE = str(Path(__file__).resolve().parents[2] / "configs" / "ppo_tiny_cpu.py")

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- #
# Shared strategies
# --------------------------------------------------------------------------- #

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=6)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)

# Bytes that sit on a branch somewhere: BOMs, NUL, lone and cut UTF-8 lead bytes,
# surrogate escapes, JSON punctuation, literals, gzip and other magic numbers.
NASTY = [
    b"}{", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\x00", b"\xff", b"\xc3", b"\xe2\x82",
    b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\\ud800", b"\\u12", b"\\", b'"', b"[", b"]", b",", b":",
    b"{", b"}", b"\n", b"\r\n", b"NaN", b"-Infinity", b"tru", b"1e",
    b"\x1f\x8b", b"BZh", b"PK\x03\x04", b"\t", b"\x0b", "é".encode(), "\u2028".encode(),
]


@st.composite
def damaged(draw, data: bytes, max_mutations: int = 3) -> bytes:
    """``data`` with a few structural mutations applied."""
    for _ in range(draw(st.integers(0, max_mutations))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "join"]))
        if kind == "truncate":
            data = data[:at]
        elif kind == "flip" and data:
            at = min(at, len(data) - 1)
            data = data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1 :]
        elif kind == "insert":
            data = data[:at] + draw(st.sampled_from(NASTY) | st.binary(max_size=4)) + data[at:]
        elif kind == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 8)) :]
        elif kind == "join":
            data = re.sub(rb"\}\s+\{", b"}{", data, count=1)
    return data


# --------------------------------------------------------------------------- #
# The row reader (S-DATA-3, S-DATA-4)
# --------------------------------------------------------------------------- #


@st.composite
def row_documents(draw) -> bytes:
    rows = draw(st.lists(st.dictionaries(st.text(max_size=4), json_values, max_size=3), min_size=1, max_size=4))
    ascii_only = draw(st.booleans())
    layout = draw(st.sampled_from(["jsonl", "pretty", "array", "spaced"]))
    if layout == "jsonl":
        text = "\n".join(json.dumps(r, ensure_ascii=ascii_only) for r in rows) + "\n"
    elif layout == "pretty":
        text = "\n".join(json.dumps(r, indent=2, ensure_ascii=ascii_only) for r in rows)
    elif layout == "array":
        text = json.dumps(rows, indent=draw(st.sampled_from([None, 1])), ensure_ascii=ascii_only)
    else:
        gaps = draw(st.lists(st.sampled_from([" ", "\t", "\r\n", "\n\n"]), min_size=len(rows), max_size=len(rows)))
        text = "".join(json.dumps(r, ensure_ascii=ascii_only) + gap for r, gap in zip(rows, gaps))
    return text.encode("utf-8")


@st.composite
def row_files(draw) -> bytes:
    data = draw(damaged(draw(row_documents())))
    if draw(st.booleans()):
        data = draw(st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"  \n"])) + data
    wrap = draw(st.sampled_from(["plain", "plain", "gzip", "gzip-cut", "gzip-flipped", "gzip-tail", "refused"]))
    if wrap == "plain":
        return data
    if wrap == "refused":
        return draw(st.sampled_from([b"BZh91AY", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd", b"PK\x03\x04"])) + data
    packed = gzip.compress(data, mtime=0)
    if wrap == "gzip-cut":
        return packed[: draw(st.integers(0, len(packed) - 1))]
    if wrap == "gzip-flipped":
        return draw(damaged(packed, max_mutations=2))
    # a second member, zero padding, or junk after the last member
    tails = [gzip.compress(b'{"a": 1}\n'), b"\x00" * 7, b"\x00junk", b"\x1f", b"\x1f\x8bxx"]
    return packed + draw(st.sampled_from(tails))


def _read_all(path: str, chunk_size: int) -> tuple[list, RowReadError | None]:
    rows = []
    try:
        for row in iter_rows(path, chunk_size=chunk_size):
            rows.append(row)
    except RowReadError as error:
        return rows, error
    return rows, None


def _check_rows(path: str, chunk_size: int) -> tuple[list, RowReadError | None]:
    rows, error = _read_all(path, chunk_size)
    for index, row in enumerate(rows):
        assert type(row.value) is dict
        assert (row.position.row, row.position.line >= 1, row.position.column >= 1) == (index, True, True)
    if error is not None:
        assert error.row == len(rows), "a refusal names the row being read, right after the rows yielded"
        assert error.line >= 1 and error.column >= 1
        assert str(error).startswith(f"{path} row {error.row} (line {error.line}, column {error.column}): ")
    return rows, error


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("untrusted")


CHUNK_SIZES = st.sampled_from([1, 2, 3, 7, 64, 1 << 20])


@PROPERTY
@given(data=row_files(), chunk_size=CHUNK_SIZES)
@example(data=b'{"a": ' + b"9" * 5000 + b"}\n", chunk_size=7)  # past Python's int-digit limit
@example(data=b'{"a": ' + b"[" * 3000, chunk_size=1 << 20)  # past the recursion limit
@example(data=gzip.compress(b'{"a": 1}\n{"b": "\xff"}\n')[:-9], chunk_size=3)
def test_row_reader_accepts_or_refuses_with_a_position(scratch, data, chunk_size):
    path = scratch / "rows.jsonl"
    path.write_bytes(data)
    rows, error = _check_rows(str(path), chunk_size)
    event("refused" if error else "accepted")
    if error:
        event(error.problem.split(":")[0].split("(")[0][:40])


@PROPERTY
@given(data=st.binary(max_size=48), prefix=st.sampled_from([b"", b"\x1f\x8b", b"\x1f\x8b\x08\x00", b"{", b"["]),
       chunk_size=CHUNK_SIZES)
def test_row_reader_on_arbitrary_bytes(scratch, data, prefix, chunk_size):
    path = scratch / "bytes.jsonl"
    path.write_bytes(prefix + data)
    _check_rows(str(path), chunk_size)


@settings(PROPERTY, max_examples=150)  # a round-trip check beside the 300-example refusal property
@given(document=row_documents(), gzipped=st.booleans(), chunk_size=CHUNK_SIZES)
def test_undamaged_documents_are_read_exactly(scratch, document, gzipped, chunk_size):
    path = scratch / "clean.jsonl"
    path.write_bytes(gzip.compress(document, mtime=0) if gzipped else document)
    rows, error = _check_rows(str(path), chunk_size)
    assert error is None
    text = document.decode()
    decoder, expected, at = json.JSONDecoder(), [], 0
    if text.lstrip().startswith("["):
        expected = json.loads(text)
    else:
        while text[at:].strip():
            at += len(text[at:]) - len(text[at:].lstrip())
            value, at = decoder.raw_decode(text, at)
            expected.append(value)
    assert [row.value for row in rows] == expected


# --------------------------------------------------------------------------- #
# The override parser (S-RUN-2)
# --------------------------------------------------------------------------- #


def _dotted_keys(model: type, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        keys.append(key)
        section = _section_model(field.annotation)
        if section is not None:
            keys.extend(_dotted_keys(section, key + "."))
    return keys


SCHEMA_KEYS = _dotted_keys(PPOConfig)

override_keys = st.sampled_from(SCHEMA_KEYS) | st.builds(
    lambda key, tail: key + tail,
    st.sampled_from(SCHEMA_KEYS),
    st.sampled_from([".", "..x", ".nope", " ", "\x00", ".0", "[0]", ""]),
) | st.text(max_size=8)

override_values = (
    json_values.map(json.dumps)
    | st.sampled_from(["", "nan", "NaN", "Infinity", "-", "{", "[", "null", "true", "1e999", "9" * 5000,
                       "[" * 3000, '"\\ud800"', "a=b", "  7  ", "0x10", "\x00", "-0"])
    | st.text(max_size=10)
)


@st.composite
def override_texts(draw) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=12))  # possibly without any '='
    return f"{draw(override_keys)}={draw(override_values)}"


@pytest.fixture(scope="module")
def tiny_config() -> PPOConfig:
    return load_profile(TINY_PROFILE)


def _check_config_error(error: ConfigError) -> None:
    assert error.problems, "a ConfigError lists at least one problem"
    for problem in error.problems:
        # Each problem names what it is about before a colon: a dotted key, or the
        # override text itself when it has no key.
        head, colon, _ = problem.partition(": ")
        assert colon and head.strip(), problem


@PROPERTY
@given(text=override_texts())
@example(text="rl.max_steps=" + "9" * 5000)
@example(text="rl.max_steps=" + "[" * 3000)
def test_parse_override_returns_a_key_or_refuses_naming_it(text):
    try:
        key, _ = parse_override(text)
    except ConfigError as error:
        _check_config_error(error)
        key = text.partition("=")[0].strip()
        assert error.problems[0].startswith(f"{key}: " if "=" in text and key else f"override {text!r}: ")
        return
    assert key and key == key.strip()


@PROPERTY
@given(overrides=st.lists(override_texts(), min_size=1, max_size=3))
def test_apply_overrides_validates_or_refuses_naming_the_key(tiny_config, overrides):
    try:
        config = apply_overrides(tiny_config, overrides)
    except ConfigError as error:
        _check_config_error(error)
        return
    assert isinstance(config, PPOConfig)


@settings(PROPERTY, max_examples=40)
@given(overrides=st.lists(override_texts(), max_size=2))
def test_load_config_with_overrides_accepts_or_refuses(overrides):
    try:
        load_config(TINY_PROFILE, overrides)
    except ConfigError as error:
        _check_config_error(error)


# --------------------------------------------------------------------------- #
# The marker and the latest pointer (S-CKPT-2..4)
# --------------------------------------------------------------------------- #


@st.composite
def marker_texts(draw) -> bytes:
    marker = {"version": 1, "iteration": 3, "role_steps": {"policy": 6, "critic": 6},
              "loop_state": {"critic_warmup_iterations": 0}}
    for key in draw(st.lists(st.sampled_from(sorted(marker)), max_size=2, unique=True)):
        if draw(st.booleans()):
            del marker[key]
        else:
            marker[key] = draw(json_values)
    if draw(st.booleans()):
        marker = draw(st.sampled_from([marker, [marker], None, 3, "iter_000003"]))
    data = json.dumps(marker, indent=draw(st.sampled_from([None, 2]))).encode()
    return draw(damaged(data))


def _read_or_refuse(read, path: str, *, naming: str) -> tuple[bool, object]:
    """(True, what ``read`` returned), or (False, None) after a CheckpointError that
    names the file it refused."""
    try:
        return True, read(path)
    except CheckpointError as error:
        assert naming in str(error)
        return False, None


def _check_marker(marker: dict | None) -> None:
    assert isinstance(marker, dict)
    assert type(marker["iteration"]) is int and marker["iteration"] >= 0
    steps = marker.get("role_steps")
    assert steps is None or (isinstance(steps, dict) and all(type(v) is int for v in steps.values()))
    assert marker.get("loop_state") is None or isinstance(marker["loop_state"], dict)


@PROPERTY
@given(data=marker_texts() | st.binary(max_size=32))
@example(data=b'{"iteration": 1, "x": ' + b"9" * 5000 + b"}")
@example(data=b'{"iteration": 1, "x": "\xff"}')
@example(data=b'{"iteration": true}')
@example(data=b'{"iteration": 1, "role_steps": 5}')
@example(data=b'{"iteration": 1, "loop_state": 5}')
def test_read_marker_accepts_or_refuses_naming_the_file(scratch, data):
    boundary = scratch / "iter_000003"
    boundary.mkdir(exist_ok=True)
    (boundary / "_SUCCESS").write_bytes(data)
    accepted, marker = _read_or_refuse(read_marker, str(boundary), naming=f"{boundary}/_SUCCESS")
    if accepted:
        _check_marker(marker)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    """iter_000001 committed, iter_000002 not; a committed-looking boundary outside."""
    base = tmp_path_factory.mktemp("pointer")
    root = base / "run" / "checkpoints"
    good = {"version": 1, "iteration": 1, "role_steps": {"policy": 2}, "loop_state": {}}
    for boundary in (root / "iter_000001", base / "elsewhere" / "iter_000009"):
        boundary.mkdir(parents=True)
        (boundary / "_SUCCESS").write_text(json.dumps(good))
    (root / "iter_000002").mkdir()
    return root


pointer_names = st.sampled_from([
    "iter_000001", "iter_000002", "iter_000007", "iter_", "iter_000001/../../../elsewhere/iter_000009",
    "iter_0/../../../elsewhere/iter_000009", "../elsewhere/iter_000009", "/etc", "iter_000001\x00",
    "iter_000001\niter_000002", "iter_-1", "iter_1e3", "iter_000001 ", "ITER_000001", "iter_٣",
]) | st.text(max_size=12).map(lambda tail: "iter_" + tail)


@PROPERTY
@given(data=st.one_of(pointer_names.map(str.encode), pointer_names.flatmap(lambda n: damaged(n.encode())),
                      st.binary(max_size=24)))
@example(data=b"iter_000001/../../../elsewhere/iter_000009\n")
@example(data=b"iter_\xff")
@example(data=b"iter_000001\x00")
def test_read_latest_resolves_inside_the_root_or_refuses(checkpoints, data):
    (checkpoints / "latest_checkpoint.txt").write_bytes(data)
    accepted, boundary = _read_or_refuse(read_latest, str(checkpoints), naming=f"{checkpoints}/latest_checkpoint.txt")
    if accepted:
        assert boundary == f"{checkpoints}/iter_000001"
