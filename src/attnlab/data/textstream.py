"""A corpus read as a stream of text, in bounded memory: documents, chunks and encoding pieces.

A corpus is a list of sources: the built-in ``pydoc`` and ``stdlib`` corpora, text files, and
folders (read recursively in sorted path order, hidden files and folders left out). Each file is
one *document*. A document is checked before it is read for tokens (the first 8 KiB without a NUL
byte, the whole file valid UTF-8, at least one character); a file that fails is skipped and
counted under ``binary``, ``not_utf8``, ``empty`` or ``unreadable``, never fatal.

The text of the corpus is the documents joined by a newline (``"\\n".join``, as the first release
read a folder), cut at ``max_chars`` characters. :func:`pieces` cuts a document's text into
strings whose token ids, encoded one by one, concatenate to the ids of the whole text as the first
release encoded it: byte-level BPE encoded groups of 256 lines (``str.splitlines``) separately,
and a group is only cut further where a non-space ASCII character is followed by a space, tab or
line break (always a boundary of GPT-2's pre-tokenizer, so the cut does not change the ids). Which
pieces come out therefore depends on the text only, never on how it was read.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from pydoc_data.topics import topics

from attnlab.errors import UserError

__all__ = [
    "BUILTIN_CORPORA",
    "STDLIB_MAX_CHARS",
    "Document",
    "Skip",
    "SKIP_REASONS",
    "plan_corpus",
    "read_document",
    "corpus_text",
    "document_texts",
    "pieces",
    "safe_cut",
    "pydoc_text",
    "stdlib_files",
]

BUILTIN_CORPORA = ("pydoc", "stdlib")
STDLIB_MAX_CHARS = 4_000_000
SKIP_REASONS = ("binary", "not_utf8", "empty", "unreadable")
#: bytes read at a time
READ_BYTES = 1 << 20
#: lines per encoding group (the first release's BPE grouping)
GROUP_LINES = 256
#: a piece longer than this many characters is cut at a safe point
MAX_PIECE_CHARS = 1 << 20
_SAFE_CUT = re.compile(r"[!-~](?=[ \t\n\r])")


class Skip(Exception):
    """A document that is left out; ``reason`` is one of :data:`SKIP_REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass
class Document:
    """One document of a corpus: a file, or a built-in corpus.

    Attributes:
        name: ``pydoc``, ``stdlib`` or the file's absolute path.
        size: bytes on disk (an estimate for built-ins), for progress and sampling.
        identity: what changes when the text does (path, size, modification time; a hash for
            built-ins): keys caches and checks that a resumed preparation reads the same corpus.
    """

    name: str
    size: int
    identity: str
    path: Path | None = None
    text: str | None = field(default=None, repr=False)


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files (tests and third-party packages left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())
    return [p for p in files if not skip & set(p.relative_to(root).parts)]


def pydoc_text() -> str:
    """CPython's help topics (``pydoc_data.topics``), joined in sorted order."""
    return "\n\n".join(topics[k].strip("\n") for k in sorted(topics)) + "\n"


def _builtin(name: str, max_chars: int | None) -> Document:
    if name == "pydoc":
        text = pydoc_text()
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        return Document("pydoc", len(text.encode()), f"pydoc:{digest}", text=text)
    cap = max_chars or STDLIB_MAX_CHARS
    h = hashlib.sha256(f"stdlib:{cap}".encode())
    size = 0
    for p in stdlib_files():
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}\n".encode())
        size += st.st_size
    return Document("stdlib", min(size, cap), f"stdlib:{h.hexdigest()[:16]}")


def _file(path: Path) -> Document:
    try:
        st = path.stat()
    except OSError:
        return Document(str(path), 0, f"{path}:unreadable", path=path)
    return Document(str(path), st.st_size, f"{path}:{st.st_size}:{st.st_mtime_ns}", path=path)


def plan_corpus(sources: str | Sequence[str], max_chars: int | None = None) -> list[Document]:
    """The documents of a corpus, in reading order, without reading them.

    Args:
        sources: built-in names, files and folders (one string or several).
        max_chars: the character cap (``stdlib`` alone defaults to 4 million).

    Raises:
        UserError: an unknown name or a missing path.
    """
    if isinstance(sources, str):
        sources = [sources]
    if not sources:
        raise UserError("no corpus given")
    docs: list[Document] = []
    for source in sources:
        if source in BUILTIN_CORPORA:
            docs.append(_builtin(source, max_chars))
            continue
        path = Path(source).expanduser()
        if not path.exists():
            raise UserError(
                f"unknown corpus {source!r}: not a built-in corpus "
                f"({', '.join(BUILTIN_CORPORA)}) and no such file or folder"
            )
        path = path.resolve()
        if not path.is_dir():
            docs.append(_file(path))
            continue
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            if not any(part.startswith(".") for part in f.relative_to(path).parts):
                docs.append(_file(f))
    return docs


def _decoded_chunks(path: Path) -> Iterator[str]:
    """The text of a UTF-8 file in chunks (raises UnicodeDecodeError / OSError)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        while True:
            data = f.read(READ_BYTES)
            text = decoder.decode(data, final=not data)
            if text:
                yield text
            if not data:
                return


def _check_file(path: Path) -> None:
    """Raise :class:`Skip` for a binary, non-UTF-8, empty or unreadable file (reads it once)."""
    try:
        with open(path, "rb") as f:
            if b"\x00" in f.read(8192):
                raise Skip("binary", str(path))
        n = 0
        for chunk in _decoded_chunks(path):
            n += len(chunk)
    except UnicodeDecodeError as err:
        raise Skip("not_utf8", f"{path}: {err}") from None
    except OSError as err:
        raise Skip("unreadable", f"{path}: {err}") from None
    if n == 0:
        raise Skip("empty", str(path))


def _stdlib_chunks(cap: int) -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    size = 0
    for path in stdlib_files():
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text:
            continue
        piece = f"# {path.relative_to(root).as_posix()}\n{text}\n"
        yield piece[: cap - size]
        size += len(piece)
        if size >= cap:
            return


def read_document(doc: Document, max_chars: int | None = None) -> Iterator[str]:
    """The text of ``doc`` in chunks of about a MiB.

    A file is checked first (:class:`Skip` is raised before any text is yielded); an error while
    reading it afterwards (the file changed meanwhile) is a :class:`~attnlab.errors.UserError`.
    """
    if doc.name == "pydoc" and doc.path is None:
        text = doc.text if doc.text is not None else pydoc_text()
        for i in range(0, len(text), READ_BYTES):
            yield text[i : i + READ_BYTES]
        return
    if doc.name == "stdlib" and doc.path is None:
        yield from _stdlib_chunks(max_chars or STDLIB_MAX_CHARS)
        return
    assert doc.path is not None
    _check_file(doc.path)
    try:
        yield from _decoded_chunks(doc.path)
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{doc.name} changed or became unreadable while read: {err}") from None


def document_texts(
    docs: Sequence[Document],
    max_chars: int | None = None,
    *,
    start: int = 0,
    used_chars: int = 0,
    first: bool = True,
) -> Iterator[tuple[int, Document, Iterator[str] | Skip]]:
    """Each document's text in chunks, as it stands in the corpus: after a ``"\n"`` unless it is
    the first document read, cut where the corpus reaches ``max_chars``; or the :class:`Skip` that
    left it out. Stops at the cap.

    Args:
        docs: the planned documents.
        max_chars: the corpus's character cap.
        start: the first document to read (a resumed preparation continues there).
        used_chars: characters of the corpus before ``docs[start]``.
        first: whether no document was read before ``docs[start]``.
    """
    budget = None if max_chars is None else max_chars - used_chars
    for i in range(start, len(docs)):
        if budget is not None and budget <= 0:
            return
        doc = docs[i]
        try:
            chunks = read_document(doc, max_chars)
            head = next(chunks, "")
        except Skip as skip:
            yield i, doc, skip
            continue
        text = _chain(("" if first else "\n") + head, chunks)
        first = False
        if budget is None:
            yield i, doc, text
            continue
        capped = _capped(text, budget)
        yield i, doc, capped
        for _ in capped:  # (the consumer stopped early: count what it did not read)
            pass
        budget = capped.left


class _capped:
    """Iterate ``text`` up to ``budget`` characters; ``left`` is what remains of the budget."""

    def __init__(self, text: Iterator[str], budget: int) -> None:
        self.text, self.left = text, budget

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self.left <= 0:
            raise StopIteration
        chunk = next(self.text)[: self.left]
        self.left -= len(chunk)
        return chunk


def corpus_text(docs: Sequence[Document], max_chars: int | None = None) -> Iterator[str]:
    """The corpus's text in chunks: documents joined by ``"\n"``, skipped ones left out, cut at
    ``max_chars`` (for the character alphabet and the BPE sample of small corpora)."""
    for _, _, text in document_texts(docs, max_chars):
        if not isinstance(text, Skip):
            yield from text


def _chain(head: str, rest: Iterator[str]) -> Iterator[str]:
    if head:
        yield head
    yield from rest


def safe_cut(text: str, limit: int) -> int:
    """The last position ≤ ``limit`` (and > 0) where ``text`` may be cut without changing its
    BPE ids: after a non-space ASCII character followed by a space, tab or line break; 0 if
    there is none."""
    best = 0
    for m in _SAFE_CUT.finditer(text, max(0, limit - (1 << 16)), limit):
        best = m.end()
    return best


def pieces(chunks: Iterator[str]) -> Iterator[str]:
    """Cut one document's text (given in chunks of any size) into encoding pieces.

    The pieces are groups of :data:`GROUP_LINES` lines, cut further at safe points when longer
    than :data:`MAX_PIECE_CHARS` (see the module docstring). The result depends only on the text.
    """
    group: list[str] = []  # complete lines of the current group
    group_chars = 0
    n_lines = 0  # lines of the current group, including those already emitted
    carry = ""  # the last, maybe unfinished, line
    for chunk in chunks:
        lines = (carry + chunk).splitlines(keepends=True)
        carry = lines.pop() if lines else ""
        for line in lines:
            group.append(line)
            group_chars += len(line)
            n_lines += 1
            if n_lines == GROUP_LINES:
                yield "".join(group)
                group, group_chars, n_lines = [], 0, 0
            elif group_chars > MAX_PIECE_CHARS:
                text = "".join(group)
                cut = safe_cut(text, len(text))
                cut = cut or len(text)  # (no safe point: a hard cut at a line end)
                yield text[:cut]
                group, group_chars = [text[cut:]], len(text) - cut
        while len(carry) > MAX_PIECE_CHARS:  # a very long line: cut it, keep counting lines
            cut = safe_cut(carry, len(carry) - 1) or len(carry) // 2  # (else a hard cut)
            yield "".join(group) + carry[:cut]
            group, group_chars, carry = [], 0, carry[cut:]
    if group or carry:
        yield "".join(group) + carry
