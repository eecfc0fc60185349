"""A large JSON document read in pieces: its one big array cut into runs of whole items, so a decoder never
holds the whole text (a 60 MB trace is 60 MB of bytes on top of its decoded events otherwise).

The cut is found from the text's shape (``}`` ``,`` then ``{``) and proven by the decoder: a cut anywhere
but between two items of the array leaves a piece whose brackets or strings do not close, which no JSON
decoder accepts. The caller then falls back to reading the whole file. Raw newlines cannot occur inside a
JSON string, and the cut is on ASCII bytes, so a piece is always whole UTF-8 characters.
"""

from __future__ import annotations

import codecs
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

try:  # ISA-L's inflate (the isal package, a dependency where it has wheels): zlib's API, 5x its speed
    from isal import isal_zlib as INFLATE

    INFLATE_ERROR: type[Exception] = INFLATE.error
except ImportError:  # pragma: no cover - a platform without isal wheels
    INFLATE = zlib  # type: ignore[assignment]
    INFLATE_ERROR = zlib.error

#: Compressed bytes read at a time (a trace inflates 5 to 20 times).
READ_BYTES = 1 << 18
#: The text read or inflated at a time, and gathered before a piece is cut from it (bytes). Small pieces
#: free sooner: an event's raw fields (its input shapes) keep the piece they were decoded from.
PIECE_BYTES = 1 << 19
#: How far into the text the array's key must start for the document to be read in pieces (bytes).
HEAD_LIMIT = 16 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_SPACE = b" \t\r\n"


class MoreMembers(Exception):
    """A gzip file of several members: read it whole (``gzip.decompress``)."""


class InvalidText(ValueError):
    """The text is not UTF-8; ``reason`` as :class:`UnicodeDecodeError` gives it."""


def text_blocks(path: str | Path) -> Iterator[bytes]:
    """The file's uncompressed text in blocks; gzip (by name or magic) is inflated as it is read. Raises
    ``OSError``, ``EOFError`` (truncated), ``zlib.error`` (corrupt), :class:`MoreMembers`, :class:`InvalidText`."""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as handle:
        gzipped = str(path).endswith(".gz") or handle.peek(2)[:2] == _GZIP_MAGIC
        blocks = _inflated(handle) if gzipped else _plain(handle)
        for block in blocks:
            if not block.isascii():  # an ASCII block ends on a character's boundary: no state to carry
                try:
                    utf8.decode(block)
                except UnicodeDecodeError as error:
                    raise InvalidText(error.reason) from None
            yield block
    try:
        utf8.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise InvalidText(error.reason) from None


def _plain(handle: BinaryIO) -> Iterator[bytes]:
    block = handle.read(PIECE_BYTES)
    while block:
        yield block
        block = handle.read(PIECE_BYTES)


def _inflated(handle: BinaryIO) -> Iterator[bytes]:
    inflater = INFLATE.decompressobj(31)
    data = handle.read(READ_BYTES)
    while data:
        try:
            out = inflater.decompress(data, PIECE_BYTES)
            while out:
                yield out
                out = inflater.decompress(inflater.unconsumed_tail, PIECE_BYTES) if inflater.unconsumed_tail else b""
        except INFLATE_ERROR as error:
            raise zlib.error(str(error)) from None
        if inflater.eof:
            if inflater.unused_data.strip(b"\x00") or handle.read(READ_BYTES).strip(b"\x00"):
                raise MoreMembers
            return
        data = handle.read(READ_BYTES)
    raise EOFError("Compressed file ended before the end-of-stream marker was reached")


def split_array(blocks: Iterator[bytes], key: bytes | None) -> Iterator[tuple[bool, bytearray]]:
    """Pieces of the document's array under ``key`` (``None``: the document is the array), each with whether it
    is the last: each piece but the last is ``[`` + whole items + ``]``; the last is the rest of the document,
    the array's remaining items in place. When the array is not found near the start, the one piece is the whole
    document."""
    blocks = iter(blocks)
    buffer = bytearray()
    head = b""
    start = -1
    for block in blocks:
        buffer += block
        if start < 0:
            start = _array_start(buffer, key)
            if start < 0:
                if len(buffer) > HEAD_LIMIT:
                    break
                continue
            head, buffer = bytes(buffer[:start]), buffer[start:]
        if len(buffer) >= PIECE_BYTES:
            cut, following = _last_cut(buffer)
            if cut > 0:
                with memoryview(buffer) as view:
                    piece = b"".join((b"[", view[:cut], b"]"))
                yield False, piece
                del piece, buffer[:following]
    for block in blocks:  # the array was not found: the rest as it is
        buffer += block
    if start >= 0:
        buffer[:0] = head
    yield True, bytes(buffer)


_KEY_PATTERNS: dict[bytes, re.Pattern[bytes]] = {}


def _array_start(buffer: bytearray, key: bytes | None) -> int:
    """Where the array's first item may start (just after its ``[``), or -1 when it is not in ``buffer`` yet."""
    if key is None:
        text = bytes(buffer[:64]).lstrip(_SPACE)
        if not text:
            return -1
        return len(buffer[:64]) - len(text) + 1 if text[:1] == b"[" else -1
    pattern = _KEY_PATTERNS.get(key)
    if pattern is None:
        pattern = _KEY_PATTERNS[key] = re.compile(b'"' + re.escape(key) + rb'"\s*:\s*\[')
    found = pattern.search(buffer)
    return found.end() if found is not None else -1


def _last_cut(buffer: bytearray, tries: int = 64) -> tuple[int, int]:
    """The end (just after its ``}``) of the last item that a ``,`` and a ``{`` follow, and where that ``{`` is;
    (0, 0) when there is none."""
    end = len(buffer)
    for _ in range(tries):
        brace = buffer.rfind(b"},", 0, end)
        if brace < 0:
            return 0, 0
        following = _after_space(buffer, brace + 2)
        if following < len(buffer) and buffer[following] == 0x7B:  # "{"
            return brace + 1, following
        end = brace
    return 0, 0


def _after_space(buffer: bytearray, index: int) -> int:
    size = len(buffer)
    while index < size and buffer[index] in _SPACE:
        index += 1
    return index
