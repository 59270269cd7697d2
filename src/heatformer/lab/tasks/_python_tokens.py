"""The category of every byte of Python source, by Python's own tokenizer (:mod:`tokenize`).

What the ``masked`` task's ``seg_score`` separates (:mod:`heatformer.lab.tasks._segmentation`):
each byte of a stream gets the category of the token that holds it (:data:`CATEGORIES`):

- ``layout`` (0): what no token holds or what only lays the code out -- spaces between tokens,
  ``NEWLINE`` / ``NL``, ``INDENT`` (the leading whitespace), line continuations (``\\`` and its
  newline), a tokenizer's error token made of whitespace;
- ``keyword`` (1): a ``NAME`` that :func:`keyword.iskeyword` accepts (``def``, ``None``; not
  the soft keywords ``match``, ``case``, ``_``, ``type``, which are identifiers);
- ``identifier`` (2): every other ``NAME``;
- ``operator`` (3): ``OP`` (brackets, ``:``, ``.``, ``=``, ``->``, ...);
- ``number`` (4): ``NUMBER``;
- ``string`` (5): ``STRING``, with its prefix and quotes; on Python 3.12+ the parts of an
  f-string (``FSTRING_START`` / ``MIDDLE`` / ``END``, and ``TSTRING_*``), while the expressions
  in its braces keep their own tokens' categories (Python 3.11 has one ``STRING`` token for the
  whole f-string);
- ``comment`` (6): ``COMMENT`` (from ``#`` to the end of its line, the newline not included).

A window cut from a file need not tokenize (it may start inside a string), so the *whole
stream* is tokenized once (:func:`byte_categories`; a split of the ``chars`` corpus is its
files one after the other, which tokenize as one source) and windows are cut from the result.
Where the tokenizer fails, the bytes it could not label are :data:`UNKNOWN` and left out of
the score: an error confined to a line (an ``IndentationError``; on Python 3.12+ also an
unterminated one-line string or a NUL byte) makes that line, from the end of the last token,
unknown, and the tokenizer starts again, afresh, on the next line; an error that says the
input ended inside a token or a bracket (an unterminated triple-quoted string or bracket, as
in a file that ``--max-bytes`` cut) makes the rest of the stream unknown. An error token
(Python 3.11: a stray ``$``, ``?`` or quote) and a byte that is not UTF-8 are unknown too. A
text that is not Python gets whatever categories the tokenizer makes of it. The result depends
only on the bytes and on the Python version's tokenizer (3.12 reads f-strings in parts and
``$`` as an operator).
"""

from __future__ import annotations

import io
import keyword
import tokenize
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["CATEGORIES", "UNKNOWN", "byte_categories"]

#: The category names, indexed by their id (see the module docstring).
CATEGORIES = ("layout", "keyword", "identifier", "operator", "number", "string", "comment")
#: The id of a byte the tokenizer could not label (left out of the score).
UNKNOWN = -1

_LAYOUT, _KEYWORD, _IDENTIFIER, _OPERATOR, _NUMBER, _STRING, _COMMENT = range(len(CATEGORIES))
_FIXED = {
    tokenize.OP: _OPERATOR,
    tokenize.NUMBER: _NUMBER,
    tokenize.STRING: _STRING,
    tokenize.COMMENT: _COMMENT,
    **{getattr(tokenize, name): _STRING for name in dir(tokenize) if name[1:7] == "STRING"},
    **{
        getattr(tokenize, name): _LAYOUT
        for name in ("NEWLINE", "NL", "INDENT", "DEDENT", "ENDMARKER", "ENCODING")
    },
}  # FSTRING_START/MIDDLE/END and TSTRING_* where this Python has them


def _category(token: tokenize.TokenInfo) -> int:
    """The category id of one token."""
    if token.type == tokenize.NAME:
        return _KEYWORD if keyword.iskeyword(token.string) else _IDENTIFIER
    if token.type == tokenize.ERRORTOKEN and token.string.isspace():
        return _LAYOUT
    return _FIXED.get(token.type, UNKNOWN)


def byte_categories(source: bytes) -> torch.Tensor:
    """The category of every byte of ``source`` (see the module docstring).

    Args:
        source: Python source, one file or several one after the other.

    Returns:
        ``(len(source),)`` int8: ids into :data:`CATEGORIES`, or :data:`UNKNOWN`.

    Examples:
        >>> ids = byte_categories(b"if x1 > 2:  # go\\n")
        >>> "".join("uLKIONSC"[i + 1] for i in ids.tolist())  # u: UNKNOWN, L: layout, ...
        'KKLIILOLNOLLCCCCL'
    """
    import numpy as np
    import torch

    if not isinstance(source, bytes):
        from heatformer.checks import bad_type

        raise bad_type("source", f"expected bytes, got {type(source).__name__}")
    text = source.decode("utf-8", "surrogateescape")
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    escaped = (codes >= 0xDC80) & (codes <= 0xDCFF)  # (C,) a byte that is not UTF-8
    if escaped.any():  # U+FFFD for the tokenizer (3.12's refuses surrogates)
        text = text.translate(dict.fromkeys(range(0xDC80, 0xDD00), 0xFFFD))
    starts = np.concatenate([[0], np.flatnonzero(codes == ord("\n")) + 1])  # char of each line
    offsets = _byte_offsets(codes, escaped)  # (C + 1,) byte of each character
    out = np.full(len(source), _LAYOUT, dtype=np.int8)
    line = 0  # where the tokenizer starts (0-based), after an error on the line before
    while line < len(starts) and starts[line] < len(text):
        line = _label_from(text, line, starts, offsets, out)
    out[offsets[:-1][escaped]] = UNKNOWN
    return torch.from_numpy(out)


def _byte_offsets(codes: np.ndarray, escaped: np.ndarray) -> np.ndarray:
    """``(C + 1,)`` the byte offset of each of ``C`` code points in UTF-8, and the end (an
    ``escaped`` one, U+DC80..U+DCFF, is the one byte it stands for)."""
    import numpy as np

    widths = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)
    widths[escaped] = 1
    return np.concatenate([[0], np.cumsum(widths)])


def _label_from(
    text: str, line: int, starts: np.ndarray, offsets: np.ndarray, out: np.ndarray
) -> int:
    """Tokenize ``text`` from its line ``line`` (0-based) on, writing each token's category over
    its bytes in ``out``; return the line to start again from after an error (or past the
    last line when the tokenizer reached the end), the bytes it skips set :data:`UNKNOWN`."""

    def byte(row: int, col: int) -> int:  # a token position (row 1 = ``line``) in bytes
        if line + row > len(starts):  # the end markers past a last line without its newline
            return int(offsets[-1])
        return int(offsets[min(int(starts[line + row - 1]) + col, len(offsets) - 1)])

    reached = byte(1, 0)
    try:
        for token in tokenize.generate_tokens(io.StringIO(text[starts[line] :]).readline):
            begin, end = byte(*token.start), byte(*token.end)
            out[begin:end] = _category(token)
            reached = max(reached, end)
        return len(starts)
    except (tokenize.TokenError, SyntaxError, ValueError) as error:  # ValueError: NUL bytes
        row = _error_row(error)
        if row is None or line + row >= len(starts):  # the input ended inside a token
            out[reached:] = UNKNOWN
            return len(starts)
        resume = max(line + row, line + 1)  # the line after the error's
        end = int(offsets[min(int(starts[resume]), len(offsets) - 1)])
        out[reached:end] = UNKNOWN
        return resume


def _error_row(error: Exception) -> int | None:
    """The row (1-based, of the text given to the tokenizer) of an error confined to a line,
    ``None`` for one that says the input ended (an open bracket or triple-quoted string)."""
    message = str(error.args[0]) if error.args else ""
    if "EOF" in message or "triple-quoted" in message:
        return None
    if isinstance(error, SyntaxError):
        return error.lineno
    where = error.args[1] if len(error.args) > 1 else None
    return where[0] if isinstance(where, tuple) and where and isinstance(where[0], int) else None
