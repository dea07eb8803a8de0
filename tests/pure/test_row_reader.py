"""The project's own row reader: accepted layouts, refusals and positions (S-DATA-3, S-DATA-4).

Positions are asserted exactly (row 0-based; line and column 1-based, column in
characters) so that an off-by-one anywhere makes a test fail.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import pickle
import random
import string
from pathlib import Path

import fsspec
import pytest

from data.row_reader import (
    Row,
    RowPosition,
    RowReadError,
    _maybe_truncated,
    iter_rows,
)

# Small chunk sizes make every value, escape, multi-byte character and line
# break straddle a chunk boundary somewhere; the default exercises the fast path.
CHUNK_SIZES = [1, 2, 3, 7, 64, 1 << 20]


def write(tmp_path: Path, data: bytes | str, name: str = "rows.jsonl") -> str:
    path = tmp_path / name
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


def read(path: str, chunk_size: int = 1 << 20) -> list[Row]:
    return list(iter_rows(path, chunk_size=chunk_size))


def spots(rows: list[Row]) -> list[tuple[int, int, int]]:
    return [(r.position.row, r.position.line, r.position.column) for r in rows]


def read_error(path: str, chunk_size: int = 1 << 20) -> tuple[list[Row], RowReadError]:
    """Rows yielded before the error, and the error itself."""
    got: list[Row] = []
    with pytest.raises(RowReadError) as info:
        for row in iter_rows(path, chunk_size=chunk_size):
            got.append(row)
    return got, info.value


def where(err: RowReadError) -> tuple[int, int, int]:
    return (err.row, err.line, err.column)


# --------------------------------------------------------------------------- #
# Accepted layouts (S-DATA-3)
# --------------------------------------------------------------------------- #

PRETTY = json.dumps({"prompt": "hi", "tags": ["a", "b"]}, indent=2)  # 7 lines
# Each case: text, expected values, expected (row, line, column) of each row.
ACCEPTED = {
    "jsonl": (
        '{"prompt": "a"}\n{"prompt": "b", "answer": 2}\n',
        [{"prompt": "a"}, {"prompt": "b", "answer": 2}],
        [(0, 1, 1), (1, 2, 1)],
    ),
    "jsonl_no_final_newline": (
        '{"a": 1}\n{"b": 2}',
        [{"a": 1}, {"b": 2}],
        [(0, 1, 1), (1, 2, 1)],
    ),
    "jsonl_crlf_and_blank_lines": (
        '{"a": 1}\r\n\r\n{"b": 2}\r\n',
        [{"a": 1}, {"b": 2}],
        [(0, 1, 1), (1, 3, 1)],
    ),
    "stream_one_line": (
        '{"a": 1} {"b": 2}\t{"c": 3}',
        [{"a": 1}, {"b": 2}, {"c": 3}],
        [(0, 1, 1), (1, 1, 10), (2, 1, 19)],
    ),
    "stream_pretty_printed": (
        PRETTY + "\n" + PRETTY + "\n   " + '{"last": true}\n',
        [{"prompt": "hi", "tags": ["a", "b"]}] * 2 + [{"last": True}],
        [(0, 1, 1), (1, 8, 1), (2, 15, 4)],
    ),
    "array_multiline": (
        '[\n  {"a": 1},\n  {"b": 2}\n]\n',
        [{"a": 1}, {"b": 2}],
        [(0, 2, 3), (1, 3, 3)],
    ),
    "array_one_line_after_blank_lines": (
        '\n\n  [{"a": 1},{"b": 2} , {"c": 3}]  \n',
        [{"a": 1}, {"b": 2}, {"c": 3}],
        [(0, 3, 4), (1, 3, 13), (2, 3, 24)],
    ),
    "array_pretty_printed": (
        json.dumps([{"a": 1}, {"b": [1, 2]}], indent=2),
        [{"a": 1}, {"b": [1, 2]}],
        [(0, 2, 3), (1, 5, 3)],
    ),
    "utf8_columns_count_characters": (
        '{"é": "😀"} {"b": 1}\n',
        [{"é": "😀"}, {"b": 1}],
        [(0, 1, 1), (1, 1, 12)],
    ),
    "utf8_byte_order_mark_is_skipped": (
        '\ufeff{"a": 1}\n{"b": 2}\n',
        [{"a": 1}, {"b": 2}],
        [(0, 1, 1), (1, 2, 1)],
    ),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_accepted_layouts(tmp_path, name, compress):
    """S-DATA-3: every layout, plain and gzip; positions are in the (decompressed) text."""
    text, values, positions = ACCEPTED[name]
    data = text.encode("utf-8")
    path = write(tmp_path, gzip.compress(data) if compress else data)
    rows = read(path)
    assert [r.value for r in rows] == values
    assert spots(rows) == positions
    assert all(r.position.path == path for r in rows)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_positions_do_not_depend_on_chunk_boundaries(tmp_path, name, chunk_size):
    """S-DATA-4: line/column tracking survives every chunk boundary, multi-byte characters included."""
    text, values, positions = ACCEPTED[name]
    rows = read(write(tmp_path, text), chunk_size=chunk_size)
    assert [r.value for r in rows] == values
    assert spots(rows) == positions


def test_gzip_is_detected_by_magic_bytes_not_by_name(tmp_path):
    """S-DATA-3: a gzip file named .jsonl is decompressed; a plain file named .gz is read as text."""
    data = b'{"a": 1}\n{"b": 2}\n'
    gz_named_jsonl = write(tmp_path, gzip.compress(data), "rows.jsonl")
    plain_named_gz = write(tmp_path, data, "rows.jsonl.gz")
    assert [r.value for r in read(gz_named_jsonl)] == [{"a": 1}, {"b": 2}]
    assert [r.value for r in read(plain_named_gz)] == [{"a": 1}, {"b": 2}]


def test_concatenated_gzip_members_are_one_stream(tmp_path):
    data = gzip.compress(b'{"a": 1}\n') + gzip.compress(b'{"b": 2}\n')
    rows = read(write(tmp_path, data, "rows.gz"), chunk_size=3)
    assert [r.value for r in rows] == [{"a": 1}, {"b": 2}]
    assert spots(rows) == [(0, 1, 1), (1, 2, 1)]


def test_rows_are_exactly_as_written(tmp_path):
    """S-DATA-3: no key is added across rows, nulls stay, mixed prompt shapes stay mixed."""
    lines = [
        {"prompt": "plain", "answer": 3},
        {"prompt": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]},
        {"prompt": [{"role": "user", "content": "hi"}], "extra": None},
    ]
    rows = read(write(tmp_path, "\n".join(json.dumps(x) for x in lines)))
    assert [r.value for r in rows] == lines
    assert [sorted(r.value) for r in rows] == [["answer", "prompt"], ["prompt"], ["extra", "prompt"]]
    assert type(rows[0].value) is dict


def test_fsspec_urls(tmp_path):
    """S-DATA-3: any fsspec URL, and the position names the path as the user wrote it."""
    local = write(tmp_path, '{"a": 1}\n')
    url = f"file://{local}"
    assert [r.position for r in read(url)] == [RowPosition(url, 0, 1, 1)]

    fs = fsspec.filesystem("memory")
    fs.pipe("/row_reader_test/rows.jsonl", gzip.compress(b'\n{"m": 1}\n'))
    try:
        rows = read("memory://row_reader_test/rows.jsonl")
    finally:
        fs.rm("/row_reader_test", recursive=True)
    assert [(r.value, str(r.position)) for r in rows] == [
        ({"m": 1}, "memory://row_reader_test/rows.jsonl row 0 (line 2, column 1)")
    ]


def test_a_row_larger_than_many_chunks(tmp_path):
    big = {"prompt": "x" * 200_000, "n": list(range(1000))}
    rows = read(write(tmp_path, '{"a": 1}\n' + json.dumps(big) + '\n{"z": 0}'), chunk_size=1024)
    assert [r.value for r in rows] == [{"a": 1}, big, {"z": 0}]
    assert spots(rows) == [(0, 1, 1), (1, 2, 1), (2, 3, 1)]


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.randint(-(10**15), 10**15)
    if kind == 2:
        return rng.choice([rng.uniform(-1e300, 1e300), rng.random(), 1e-7, -0.0, 2.5e17])
    if kind in (3, 4):
        alphabet = string.ascii_letters + '"\\/\b\f\n\r\t\x01é😀\u2028 '
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(8)))
    if kind in (5, 6):
        return {f"k{rng.randrange(99)}é": _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def _random_document(rng: random.Random) -> str:
    value = {"v": _random_value(rng), "s": _random_value(rng)}
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
    return text.replace("e+", rng.choice(["e+", "E+", "e"]))


def test_random_documents_at_tiny_chunk_sizes(tmp_path):
    """Whatever straddles a chunk boundary (escapes, surrogates, exponents, literals) decodes as json.loads."""
    rng = random.Random(20240607)
    docs = [_random_document(rng) for _ in range(60)]
    expected = [json.loads(d) for d in docs]
    path = write(tmp_path, "\n".join(docs))
    for chunk_size in (1, 2, 5):
        assert [r.value for r in read(path, chunk_size=chunk_size)] == expected


def test_truncation_test_never_refuses_a_valid_prefix():
    """Every prefix of a valid document must count as 'read more', or a chunk boundary could refuse a valid file."""
    rng = random.Random(7)
    decode = json.JSONDecoder().raw_decode
    checked = 0
    for _ in range(150):
        doc = _random_document(rng)
        for end in range(len(doc)):
            prefix = doc[:end]
            try:
                decode(prefix, 0)
            except json.JSONDecodeError as exc:
                checked += 1
                assert _maybe_truncated(prefix, exc), (exc.msg, prefix[exc.pos :], doc)
    assert checked > 1000


# --------------------------------------------------------------------------- #
# Refusals, each with its exact position (S-DATA-3, S-DATA-4)
# --------------------------------------------------------------------------- #

# Each case: file text, expected (row, line, column), a phrase the message must hold,
# and how many rows are yielded before the error.
REFUSED = {
    "objects_touching": ('{"a": 1}{"b": 2}\n', (1, 1, 9), "`}{`", 1),
    "objects_touching_later": ('{"a": 1}\n  {"b": 2}{"c": 3}\n', (2, 2, 11), "`}{`", 2),
    "comma_between_jsonl_rows": ('{"a": 1},\n{"b": 2}\n', (1, 1, 9), "unexpected ','", 1),
    "number_row": ('{"a": 1}\n42\n', (1, 2, 1), "a JSON number, not a JSON object", 1),
    "string_row": ('{"a": 1}\n  "text"\n', (1, 2, 3), "a JSON string, not a JSON object", 1),
    "null_row": ('{"a": 1}\nnull\n', (1, 2, 1), "JSON null, not a JSON object", 1),
    "list_row_after_first_line": ('{"a": 1}\n[{"b": 2}]\n', (1, 2, 1), "a JSON array, not a JSON object", 1),
    "array_of_non_objects": ('[{"a": 1}, 3]', (1, 1, 12), "a JSON number, not a JSON object", 1),
    "array_nested": ("[[1, 2]]", (0, 1, 2), "a JSON array, not a JSON object", 0),
    "syntax_error": (
        '{"a": 1}\n{"b": x}\n',
        (1, 2, 7),
        "invalid JSON: Expecting value; the row starts at line 2, column 1",
        1,
    ),
    "syntax_error_in_pretty_row": (
        '{"a": 1}\n{\n  "b": 1\n  "c": 2\n}\n',
        (1, 4, 3),
        "Expecting ',' delimiter; the row starts at line 2, column 1",
        1,
    ),
    "raw_newline_in_string": ('{"a": "one\ntwo"}\n', (0, 1, 11), "Invalid control character", 0),
    "unclosed_object_at_end": ('{"a": 1}\n{"b": 1', (1, 2, 8), "Expecting ',' delimiter", 1),
    "unterminated_string_at_end": ('{"a": "abc', (0, 1, 7), "Unterminated string", 0),
    "empty_file": ("", (0, 1, 1), "the file is empty", 0),
    "whitespace_only_file": ("\n\n  ", (0, 3, 3), "the file is empty", 0),
    "empty_array": (" []", (0, 1, 3), "the top-level array is empty", 0),
    "unclosed_array": ('[{"a": 1},\n {"b": 2}\n', (2, 3, 1), "never closed with ']'", 2),
    "trailing_comma_in_array": ('[{"a": 1},]', (1, 1, 11), "trailing ','", 1),
    "missing_comma_in_array": ('[{"a": 1} {"b": 2}]', (1, 1, 11), "expected ',' or ']'", 1),
    "content_after_array": ('[{"a": 1}]\n{"b": 2}\n', (1, 2, 1), "either one JSON array or a stream", 1),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize(
    ("chunk_size", "compress"), [(1, False), (3, False), (1 << 20, False), (2, True), (1 << 20, True)]
)
def test_refusals_name_the_exact_position(tmp_path, name, chunk_size, compress):
    """S-DATA-4: same positions whatever the chunking, gzip or not (positions are in the text)."""
    text, position, phrase, yielded = REFUSED[name]
    data = text.encode("utf-8")
    path = write(tmp_path, gzip.compress(data) if compress else data)
    rows, err = read_error(path, chunk_size=chunk_size)
    assert where(err) == position
    row, line, column = position
    assert str(err).startswith(f"{path} row {row} (line {line}, column {column}): ")
    assert phrase in str(err)
    assert "Accepted:" in str(err)  # every refusal says what would be read
    assert len(rows) == yielded


COMPRESSED = {
    "bzip2": bz2.compress(b'{"a": 1}\n'),
    "xz": lzma.compress(b'{"a": 1}\n'),
    "zstd": b"\x28\xb5\x2f\xfd" + b"\x00" * 20,  # magic bytes are all that is looked at
    "zip": b"PK\x03\x04" + b"\x00" * 20,
}


@pytest.mark.parametrize("fmt", sorted(COMPRESSED))
def test_other_compressions_are_refused_by_magic_bytes(tmp_path, fmt):
    """S-DATA-3: named .jsonl on purpose: the bytes, not the name, decide."""
    path = write(tmp_path, COMPRESSED[fmt], "rows.jsonl")
    _, err = read_error(path)
    assert where(err) == (0, 1, 1)
    assert f"the file is {fmt}-compressed" in str(err)
    assert "decompress it, or compress it with gzip" in str(err)


# --------------------------------------------------------------------------- #
# UTF-8 errors are reported in file order (S-DATA-4)
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 1 << 20])
def test_bad_row_before_invalid_utf8_is_reported_first(tmp_path, chunk_size):
    data = b'{"a": 1}\n{"b": x}\n{"c": "\xff"}\n'
    _, err = read_error(write(tmp_path, data), chunk_size=chunk_size)
    assert where(err) == (1, 2, 7)
    assert "Expecting value" in str(err)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 1 << 20])
def test_bad_value_right_before_invalid_utf8_is_reported_first(tmp_path, chunk_size):
    """The invalid byte cuts the text; the bad token before it is still the first problem."""
    _, err = read_error(write(tmp_path, b'{"a": 1}\n{"b": x\xff}\n'), chunk_size=chunk_size)
    assert where(err) == (1, 2, 7)
    assert "Expecting value" in str(err)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 1 << 20])
def test_invalid_utf8_before_bad_row_is_reported_with_its_position(tmp_path, chunk_size):
    data = b'{"a": 1}\n{"b": "\xc3\xa9\xff"}\n{"c": x}\n'
    rows, err = read_error(write(tmp_path, data), chunk_size=chunk_size)
    assert [r.value for r in rows] == [{"a": 1}]
    assert where(err) == (1, 2, 9)  # é is one character: the bad byte is the 9th
    assert "byte(s) ff at byte offset 18 are not valid UTF-8 (invalid start byte)" in str(err)


def test_invalid_utf8_between_rows(tmp_path):
    rows, err = read_error(write(tmp_path, b'{"a": 1}\n\n  \x80{"b": 2}\n'))
    assert len(rows) == 1
    assert where(err) == (1, 3, 3)


def test_invalid_utf8_in_gzip_names_the_decompressed_offset(tmp_path):
    data = gzip.compress(b'{"a": 1}\n{"b": "\xe9t\xe9"}\n')  # Latin-1, not UTF-8
    _, err = read_error(write(tmp_path, data, "rows.jsonl.gz"))
    assert where(err) == (1, 2, 8)
    assert "at byte offset 16 of the decompressed stream" in str(err)


def test_utf8_cut_off_at_end_of_file(tmp_path):
    _, err = read_error(write(tmp_path, b'{"a": "\xc3'), chunk_size=1)
    assert where(err) == (0, 1, 8)
    assert "unexpected end of data" in str(err)


def test_utf16_file_is_refused_with_a_hint(tmp_path):
    _, err = read_error(write(tmp_path, '{"a": 1}\n'.encode("utf-16")), chunk_size=1)
    assert where(err) == (0, 1, 1)
    assert "UTF-16" in str(err) and "save it as UTF-8" in str(err)


GZ_ROWS = b"".join(b'{"n": %d}\n' % i for i in range(200))
GZ = gzip.compress(GZ_ROWS, mtime=0)


@pytest.mark.parametrize(
    ("damaged", "rows_before", "position", "reason"),
    [
        # Decompression stops inside `{"n": 198}` (col 9): every row before it is yielded.
        (GZ[:-12], 198, (198, 199, 9), "ends before its end-of-stream marker"),
        (GZ + b"junk", 200, (200, 201, 1), "trailing bytes after a gzip member"),
        (GZ[:30] + bytes([GZ[30] ^ 0xFF]) + GZ[31:], 0, (0, 1, 1), "Error -3 while decompressing"),
    ],
    ids=["truncated", "trailing_garbage", "corrupt"],
)
def test_damaged_gzip_yields_the_rows_before_the_damage(tmp_path, damaged, rows_before, position, reason):
    rows, err = read_error(write(tmp_path, damaged, "rows.gz"))
    assert [r.value["n"] for r in rows] == list(range(rows_before))
    assert where(err) == position
    assert "the gzip stream is truncated or corrupt" in str(err) and reason in str(err)


def test_gzip_zero_padding_after_the_last_member_is_accepted(tmp_path):
    rows = read(write(tmp_path, GZ + b"\x00" * 5, "rows.gz"), chunk_size=7)
    assert len(rows) == 200


# --------------------------------------------------------------------------- #
# The API's edges
# --------------------------------------------------------------------------- #


def test_error_attributes_and_pickling(tmp_path):
    """Errors cross process boundaries (Ray) with their attributes intact."""
    path = write(tmp_path, '{"a": 1}\n7\n')
    _, err = read_error(path)
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, ValueError)
    assert (copy.path, copy.row, copy.line, copy.column) == (path, 1, 2, 1)
    assert str(copy) == str(err)


def test_position_str_is_the_where_used_by_other_messages():
    assert str(RowPosition("data.jsonl", 3, 7, 1)) == "data.jsonl row 3 (line 7, column 1)"


def test_the_file_is_opened_lazily(tmp_path):
    rows = iter_rows(str(tmp_path / "missing.jsonl"))  # no error yet
    with pytest.raises(FileNotFoundError):
        next(rows)


def test_chunk_size_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="chunk_size"):
        next(iter_rows(write(tmp_path, "{}"), chunk_size=0))
