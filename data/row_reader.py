"""The project's own reader for local (or fsspec) files of JSON rows (S-DATA-3).

Each row is decoded alone, as the plain ``dict`` its JSON text spells: a columnar
reader (``datasets``, pandas) would null-fill one row's keys into every other and
refuse a column that mixes strings and lists. docs/data.md "The row reader" gives the
layouts accepted, how rows, lines and columns are counted (S-DATA-4) and the refusals.
"""

from __future__ import annotations

from contracts.faults import RepeatsOnRerun

import json
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import fsspec

__all__ = [
    "ACCEPTED_LAYOUTS",
    "DEFAULT_CHUNK_SIZE",
    "Row",
    "RowPosition",
    "RowReadError",
    "iter_rows",
]

DEFAULT_CHUNK_SIZE = 1 << 20
"""Bytes read (after decompression) per refill: big enough that per-chunk
overhead vanishes, small enough that memory stays flat on multi-GB files."""

ACCEPTED_LAYOUTS = (
    "Accepted: UTF-8 text holding one JSON object per line (JSONL), "
    "a whitespace-separated stream of JSON objects, or one top-level JSON array "
    "of objects; any of these may be gzip-compressed"
)


@dataclass(frozen=True, slots=True)
class RowPosition:
    """Where a row starts, so any later stage can point the user back at it."""

    path: str
    """The file as the user named it (local path or fsspec URL)."""
    row: int
    """0-based row index: the first object in the file is row 0."""
    line: int
    """1-based line on which the row's object (its ``{``) starts."""
    column: int
    """1-based column (in characters) of the row's ``{``."""

    def __str__(self) -> str:
        # One spelling shared by every error message that names a row, e.g.
        # the prompt projection's ``where``.
        return f"{self.path} row {self.row} (line {self.line}, column {self.column})"


@dataclass(frozen=True, slots=True)
class Row:
    """One decoded row and where it came from."""

    value: dict
    """The JSON object exactly as written: no key added, removed or filled."""
    position: RowPosition


class RowReadError(ValueError, RepeatsOnRerun):
    """A file or one of its rows cannot be read (S-DATA-4).

    ``line``/``column`` point at the offending character (for a bad row that is
    not a JSON object: at the row's start); ``row`` is the 0-based index of the
    row being read when the problem was found.
    """

    def __init__(self, path: str, row: int, line: int, column: int, problem: str) -> None:
        self.path = path
        self.row = row
        self.line = line
        self.column = column
        self.problem = problem
        super().__init__(f"{path} row {row} (line {line}, column {column}): {problem}")

    def __reduce__(self):  # keep the attributes when pickled across processes (Ray)
        return (type(self), (self.path, self.row, self.line, self.column, self.problem))


# --------------------------------------------------------------------------- #
# Compression sniffing
# --------------------------------------------------------------------------- #

_GZIP_MAGIC = b"\x1f\x8b"
_REFUSED_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"PK\x03\x04", "zip"),
)
_HEAD_SIZE = 6


def _read_head(raw, size: int) -> bytes:
    """Read up to ``size`` bytes even from streams that return short reads."""
    head = b""
    while len(head) < size:
        part = raw.read(size - len(head))
        if not part:
            break
        head += part
    return head


class _PrefixedReader:
    """A byte stream that replays the sniffed head before the rest of ``raw``.

    Sniffing must not rely on ``seek``: not every fsspec stream can rewind.
    """

    def __init__(self, head: bytes, raw) -> None:
        self._head = head
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            return self._raw.read(size)
        if size is None or size < 0:
            data, self._head = self._head + self._raw.read(), b""
            return data
        data, self._head = self._head[:size], self._head[size:]
        if len(data) < size:
            data += self._raw.read(size - len(data))
        return data


class _GzipDamage(Exception):
    """The compressed stream is truncated or corrupt."""


class _Gunzip:
    """Streaming gzip decompression that hands out every byte before damage.

    ``gzip.GzipFile`` raises from ``read(n)`` and drops what it had already
    decompressed in that call, so a truncated multi-GB file would hide up to a
    chunk of good rows, and the rows before the damage must come first
    (S-DATA-4). Concatenated members and trailing zero padding are accepted,
    as ``gzip`` accepts them.
    """

    _READ = 1 << 16

    def __init__(self, raw: _PrefixedReader) -> None:
        self._raw = raw
        self._z = zlib.decompressobj(wbits=31)  # 31: expect a gzip header and trailer
        self._input = b""  # compressed bytes not yet handed to the decompressor
        self._in_member = False
        self._done = False
        self._error: _GzipDamage | None = None

    def read(self, size: int) -> bytes:
        out = bytearray()
        while len(out) < size and not self._done and self._error is None:
            try:
                out += self._step(size - len(out))
            except (zlib.error, _GzipDamage) as exc:
                self._error = exc if isinstance(exc, _GzipDamage) else _GzipDamage(str(exc))
        if out or self._error is None:
            return bytes(out)
        raise self._error

    def _step(self, want: int) -> bytes:
        if not self._input:
            self._input = self._raw.read(self._READ)
            if not self._input:
                if self._in_member:
                    raise _GzipDamage("the compressed data ends before its end-of-stream marker")
                self._done = True
                return b""
        if not self._in_member:
            rest = self._input.lstrip(b"\x00")  # zero padding after the last member
            if len(rest) < 2:
                more = self._raw.read(self._READ) if rest else b""
                if not more and rest:
                    raise _GzipDamage("trailing bytes after the last gzip member")
                self._input = rest + more
                return b""
            if not rest.startswith(_GZIP_MAGIC):
                raise _GzipDamage("trailing bytes after a gzip member are not gzip data")
            self._z = zlib.decompressobj(wbits=31)
            self._in_member = True
            self._input = rest
        data = self._z.decompress(self._input, want)
        self._input = self._z.unconsumed_tail
        if self._z.eof:
            # Past the end marker everything left is in unused_data (zlib may
            # leave a stale copy in unconsumed_tail).
            self._input = self._z.unused_data
            self._in_member = False
        return data


# --------------------------------------------------------------------------- #
# Bytes -> text, incrementally
# --------------------------------------------------------------------------- #


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of ``data`` without a multi-byte character cut off at its end.

    Only the tail is examined: anything malformed is left for the decoder to
    report, with its exact offset.
    """
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        need = 4 if byte >= 0xF0 else 3 if byte >= 0xE0 else 2 if byte >= 0xC0 else 1
        return n - back if need > back else n
    return n


@dataclass(frozen=True)
class _PendingError:
    """A problem in the byte stream, raised only once parsing reaches it."""

    problem: str


class _TextSource:
    """Decode a byte stream to text chunk by chunk (S-DATA-4).

    An invalid byte does not raise here: the valid text before it is handed
    out first and the error is kept in ``error``, so the parser reports any
    earlier bad row before it reports the byte.
    """

    def __init__(self, read: Callable[[int], bytes], *, gzipped: bool) -> None:
        self._read = read
        self._gzipped = gzipped
        self._carry = b""
        self._offset = 0  # bytes of (decompressed) input decoded so far
        self._first = True
        self._done = False
        self.error: _PendingError | None = None

    def read(self, size: int) -> str:
        """Return the next non-empty text, or "" when nothing more can be read."""
        while not self._done:
            text = self._read_once(size)
            if text:
                return text
        return ""

    def _read_once(self, size: int) -> str:
        if self._first:
            size = max(size, 4)  # see a whole byte-order mark in the first read
        try:
            data = self._read(size)
        except _GzipDamage as exc:
            # A truncated or corrupt gzip stream: hand out what decoded fine,
            # then report the damage where it starts.
            self.error = _PendingError(
                f"the gzip stream is truncated or corrupt after {self._offset + len(self._carry)} "
                f"decompressed bytes ({exc}); re-create the file with gzip, or decompress it"
            )
            self._done = True
            data = b""
        final = not data
        if final:
            self._done = True
        data = self._carry + data
        cut = len(data) if final else _complete_utf8_prefix(data)
        self._carry = data[cut:]
        data = data[:cut]
        if self._first and data:
            self._first = False
            if data.startswith((b"\xff\xfe", b"\xfe\xff")):
                self.error = _PendingError(
                    "the file starts with a UTF-16/UTF-32 byte-order mark "
                    f"({data[:2].hex(' ')}); save it as UTF-8. " + ACCEPTED_LAYOUTS
                )
                self._done = True
                return ""
            if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 BOM: harmless, not JSON
                data = data[3:]
                self._offset += 3
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if self.error is None:
                bad = data[exc.start : max(exc.end, exc.start + 1)]
                where = f"byte offset {self._offset + exc.start}" + (
                    " of the decompressed stream" if self._gzipped else ""
                )
                self.error = _PendingError(
                    f"byte(s) {bad.hex(' ')} at {where} are not valid UTF-8 ({exc.reason}); "
                    "the file must be UTF-8 encoded. " + ACCEPTED_LAYOUTS
                )
            self._done = True
            text = data[: exc.start].decode("utf-8")
        self._offset += len(data)
        return text


# --------------------------------------------------------------------------- #
# Telling "the buffer ends mid-value" from "the value is wrong"
# --------------------------------------------------------------------------- #

_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_TAIL = re.compile(r"[.eE][+-]?\Z")
_ESCAPE_TAIL = re.compile(r"u[0-9a-fA-F]{0,4}(\\(u[0-9a-fA-F]{0,4})?)?\Z")
_SHORT_TAIL = 12


def _maybe_truncated(buf: str, exc: json.JSONDecodeError) -> bool:
    """Could ``exc`` vanish if more text were appended to ``buf``? (True: read more.)

    Unknown shapes near the end count as truncated: a wrong True costs one more
    chunk, a wrong False refuses a valid file. Precision still matters near an
    invalid UTF-8 byte: a real syntax error just before it must be reported, not
    the byte (S-DATA-4).
    """
    if exc.msg.startswith("Unterminated string"):
        return True  # the scanner ran off the end of the buffer inside a string
    tail = buf[exc.pos :]
    if not tail:
        return True
    if len(tail) > _SHORT_TAIL:
        return False
    if exc.msg == "Expecting value":
        return any(literal.startswith(tail) for literal in _LITERALS)
    if exc.msg == "Expecting ',' delimiter":
        return _NUMBER_TAIL.match(tail) is not None  # "1." "1e" "1e+" at the end
    if exc.msg.startswith("Invalid \\uXXXX escape"):
        return _ESCAPE_TAIL.match(tail) is not None
    if exc.msg in (
        "Expecting ':' delimiter",
        "Expecting property name enclosed in double quotes",
        "Invalid control character at",
        "Invalid \\escape",
    ):
        return False
    return True


# --------------------------------------------------------------------------- #
# The parser
# --------------------------------------------------------------------------- #

_WHITESPACE = re.compile(r"[ \t\n\r]*").match
_raw_decode = json.JSONDecoder().raw_decode


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, bool):
        return f"the JSON literal {'true' if value else 'false'}"
    if value is None:
        return "JSON null"
    return "a JSON number"


class _Parser:
    """Walk a text source row by row, tracking line and column as it goes.

    The buffer keeps only the unparsed tail plus the next chunk; line numbers
    are counted incrementally (``_mark`` is how far newlines have been
    counted, ``_line_start`` the buffer index where that line begins, negative
    once the buffer has been trimmed past it).
    """

    def __init__(self, path: str, source: _TextSource, chunk_size: int) -> None:
        self.path = path
        self.source = source
        self.chunk_size = chunk_size
        self.buf = ""
        self.pos = 0
        self.row = 0
        self.eof = False
        self._mark = 0
        self._line = 1
        self._line_start = 0

    # -- positions ---------------------------------------------------------

    def locate(self, index: int) -> tuple[int, int]:
        """(line, column) of buffer ``index``; indexes must not go backwards."""
        if index > self._mark:
            newlines = self.buf.count("\n", self._mark, index)
            if newlines:
                self._line += newlines
                self._line_start = self.buf.rfind("\n", self._mark, index) + 1
            self._mark = index
        return self._line, index - self._line_start + 1

    def error(self, index: int, problem: str) -> RowReadError:
        line, column = self.locate(index)
        return RowReadError(self.path, self.row, line, column, problem)

    # -- input -------------------------------------------------------------

    def refill(self, want: int = 0) -> bool:
        """Drop parsed text, append the next chunk; False at end of input.

        ``want`` grows the read to at least the size of the value being
        retried, so a huge row costs amortised linear time, not quadratic.
        """
        if self.eof:
            return False
        self.locate(self.pos)
        if self.pos:
            self.buf = self.buf[self.pos :]
            self._line_start -= self.pos
            self._mark = 0
            self.pos = 0
        text = self.source.read(max(self.chunk_size, want))
        if text:
            self.buf += text
            return True
        if self.source.error is not None:
            raise self.error(len(self.buf), self.source.error.problem)
        self.eof = True
        return False

    def skip_whitespace(self) -> tuple[bool, bool]:
        """Advance past JSON whitespace: (a character is available, any skipped)."""
        skipped = False
        while True:
            end = _WHITESPACE(self.buf, self.pos).end()
            if end != self.pos:
                skipped = True
                self.pos = end
            if end < len(self.buf):
                return True, skipped
            if not self.refill():
                return False, skipped

    def decode_value(self, row_line: int, row_column: int) -> object:
        """Decode the JSON value at ``pos``, reading more text while it is cut off."""
        while True:
            try:
                value, end = _raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.eof or not _maybe_truncated(self.buf, exc):
                    started = "" if exc.pos == self.pos else (
                        f"; the row starts at line {row_line}, column {row_column}"
                    )
                    raise self.error(
                        exc.pos,
                        f"invalid JSON: {exc.msg}{started}. Each row must be one complete "
                        f"JSON object. {ACCEPTED_LAYOUTS}",
                    ) from None
                self.refill(len(self.buf) - self.pos)
                continue  # at end of input the retry raises the final error
            except RecursionError:
                raise self.error(
                    self.pos, "the row is nested too deeply to decode. " + ACCEPTED_LAYOUTS
                ) from None
            except ValueError as exc:  # e.g. an integer longer than Python allows
                raise self.error(self.pos, f"the row cannot be decoded: {exc}") from None
            self.pos = end
            return value

    # -- layouts -----------------------------------------------------------

    def rows(self) -> Iterator[Row]:
        available, _ = self.skip_whitespace()
        if not available:
            raise self.error(
                len(self.buf), "the file is empty (no JSON object found). " + ACCEPTED_LAYOUTS
            )
        if self.buf[self.pos] == "[":
            yield from self._array_rows()
        else:
            yield from self._stream_rows()

    def _row(self) -> Row:
        line, column = self.locate(self.pos)
        value = self.decode_value(line, column)
        if type(value) is not dict:
            raise RowReadError(
                self.path, self.row, line, column,
                f"the row is {_json_kind(value)}, not a JSON object; every row must be "
                f"an object such as {{\"prompt\": \"...\"}}. {ACCEPTED_LAYOUTS}",
            )
        return Row(value, RowPosition(self.path, self.row, line, column))

    def _stream_rows(self) -> Iterator[Row]:
        # JSONL is the special case of a stream with one object per line.
        yield self._row()
        self.row += 1
        while True:
            available, skipped = self.skip_whitespace()
            if not available:
                return
            if not skipped:
                found = self.buf[self.pos]
                hint = (
                    "two objects touch (`}{`) with no whitespace between them; put each "
                    "object on its own line"
                    if found == "{"
                    else f"unexpected {found!r} right after the previous row; rows must be "
                    "separated by whitespace (a newline for JSONL)"
                )
                raise self.error(self.pos, f"{hint}. {ACCEPTED_LAYOUTS}")
            yield self._row()
            self.row += 1

    def _array_rows(self) -> Iterator[Row]:
        open_line, open_column = self.locate(self.pos)
        self.pos += 1
        unclosed = (
            f"the top-level array opened at line {open_line}, column {open_column} is never "
            f"closed with ']'. {ACCEPTED_LAYOUTS}"
        )
        available, _ = self.skip_whitespace()
        if not available:
            raise self.error(len(self.buf), unclosed)
        if self.buf[self.pos] == "]":
            raise self.error(self.pos, "the top-level array is empty (no rows). " + ACCEPTED_LAYOUTS)
        while True:
            yield self._row()
            self.row += 1
            available, _ = self.skip_whitespace()
            if not available:
                raise self.error(len(self.buf), unclosed)
            found = self.buf[self.pos]
            if found == "]":
                self.pos += 1
                break
            if found != ",":
                raise self.error(
                    self.pos,
                    f"expected ',' or ']' after an array element, found {found!r}. "
                    + ACCEPTED_LAYOUTS,
                )
            self.pos += 1
            available, _ = self.skip_whitespace()
            if not available:
                raise self.error(len(self.buf), unclosed)
            if self.buf[self.pos] == "]":
                raise self.error(
                    self.pos, "trailing ',' before ']': JSON arrays allow none. " + ACCEPTED_LAYOUTS
                )
        available, _ = self.skip_whitespace()
        if available:
            raise self.error(
                self.pos,
                "unexpected content after the top-level array closed; a file is either one "
                "JSON array or a stream of objects, not both. " + ACCEPTED_LAYOUTS,
            )


# --------------------------------------------------------------------------- #
# Entry point
# --------------------------------------------------------------------------- #


def iter_rows(path: str | os.PathLike[str], *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[Row]:
    """Yield the file's rows in order, streaming (S-DATA-3, S-DATA-4).

    ``path`` is a local path or any fsspec URL. The file is opened lazily, on
    the first ``next()``, and closed when the iterator is exhausted or closed.
    Raises ``RowReadError`` at the first problem in file order; rows before it
    have been yielded.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of bytes, got {chunk_size}")
    name = os.fspath(path)
    with fsspec.open(name, "rb") as raw:
        head = _read_head(raw, _HEAD_SIZE)
        for magic, fmt in _REFUSED_MAGIC:
            if head.startswith(magic):
                raise RowReadError(
                    name, 0, 1, 1,
                    f"the file is {fmt}-compressed (magic bytes {magic.hex(' ')}), which is not "
                    f"read; decompress it, or compress it with gzip instead. {ACCEPTED_LAYOUTS}",
                )
        stream = _PrefixedReader(head, raw)
        gzipped = head.startswith(_GZIP_MAGIC)
        read = _Gunzip(stream).read if gzipped else stream.read
        yield from _Parser(name, _TextSource(read, gzipped=gzipped), chunk_size).rows()
