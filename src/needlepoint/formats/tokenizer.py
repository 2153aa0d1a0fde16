"""The tokenizer stored in a `.cact` archive (its last, RAW directory record).

Format and algorithm: `shared/fixtures/needle3/README.md` ("Tokenizer blob (RAW)",
"Tokenizer") and `shared/fixtures/needle2/README.md` ("Tokenizer blob", "Tokenizer and
special ids"); both generations share the blob layout. The header is 24 bytes (5 u32,
u8 add_dummy_prefix, u8 byte_fallback, u16 pad; the needle3 README's "20 bytes" is a typo,
every fixture blob parses to its exact length with 24). The encoder is upstream's
`RefTokenizer`, which is SentencePiece's BPE encoder (`bpe_model.cc`); where the two could
differ on inputs the README does not pin down, this module follows SentencePiece:

* only NORMAL pieces are merge targets and symbol ids. CONTROL, UNKNOWN and BYTE pieces live
  in SentencePiece's reserved map, so a text containing `<s>` or `<0x41>` encodes as plain
  characters. USER_DEFINED pieces are split out before BPE (SentencePiece freezes them), and
  no merge can rebuild one: any occurrence in the text would have been split out.
* without byte fallback a run of consecutive unknown symbols becomes a single UNK.

Decoding follows the README (differences from SentencePiece are listed on `decode`).
"""

from __future__ import annotations

import heapq
import math
import operator
import re
import struct
from collections.abc import Iterable, Mapping
from enum import IntEnum
from types import MappingProxyType

import numpy as np

from ..errors import TokenizerError

SPACE = "\u2581"  # SentencePiece's whitespace symbol (README "Tokenizer")
_HEADER = struct.Struct("<5IBBH")  # n_pieces, pad, eos, bos, unk, dummy prefix, fallback, pad
_PIECE = struct.Struct("<fBH")  # score, type, byte length of the UTF-8 text that follows
_HEADER_FIELDS = ("n_pieces", "pad_id", "eos_id", "bos_id", "unk_id")
_BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")
_CACHE_LIMIT = 1 << 16  # chunk-cache entries kept per tokenizer before it is emptied
_SURROGATE_ESCAPES = {c: "\ufffd" for c in range(0xDC80, 0xDD00)}


class PieceType(IntEnum):
    """Piece types of the blob (same numbering as SentencePiece's ModelProto)."""

    NORMAL = 0
    UNKNOWN = 1
    CONTROL = 2
    USER_DEFINED = 3
    BYTE = 4


class UnknownPieceError(TokenizerError, KeyError):
    """A piece or marker text that is not in the vocabulary (a TokenizerError and a KeyError)."""

    __str__ = BaseException.__str__  # plain message, not KeyError's repr-quoted one


def marker_in(markers: Mapping[str, int], text: str, kind: str) -> int:
    """The id of chat marker `text` in a tokenizer's `markers`, else an UnknownPieceError
    that says what the tokenizer keeps its markers as (`kind`)."""
    try:
        return markers[text]
    except KeyError:
        raise UnknownPieceError(f"marker {text!r} is not {kind} of this tokenizer") from None


def _utf8_replace(data: bytes) -> str:
    """UTF-8 decode with one U+FFFD per invalid byte, as SentencePiece's decoder does
    (Python's errors="replace" would fold a truncated multi-byte sequence into one U+FFFD)."""
    return data.decode("utf-8", "surrogateescape").translate(_SURROGATE_ESCAPES)


class Tokenizer:
    """SentencePiece-compatible BPE tokenizer built from an archive's tokenizer blob."""

    # what `formats.chat_format.ChatTokenizer` reads: an archive carries no chat template
    chat_template: str | None = None
    source = ""
    special_tokens: Mapping[str, str] = MappingProxyType({})

    def __init__(
        self,
        pieces: list[str],
        scores: np.ndarray,
        types: np.ndarray,
        *,
        pad_id: int,
        eos_id: int,
        bos_id: int,
        unk_id: int,
        add_dummy_prefix: bool,
        byte_fallback: bool,
    ) -> None:
        """Build from already-validated tables; use `from_blob` for archive bytes."""
        self.pieces = pieces
        self.scores = scores
        self.types = types
        self.vocab_size = len(pieces)
        self.pad_id, self.eos_id, self.bos_id, self.unk_id = pad_id, eos_id, bos_id, unk_id
        self.add_dummy_prefix = add_dummy_prefix
        self.byte_fallback = byte_fallback
        self._ids = {p: i for i, p in enumerate(pieces)}
        self._normal_id: dict[str, int] = {}
        self._merge_score: dict[str, float] = {}
        self._byte_id = [unk_id] * 256
        self.markers: dict[str, int] = {}
        token_bytes = []
        for i, (piece, kind) in enumerate(zip(pieces, types.tolist(), strict=True)):
            if kind == PieceType.NORMAL:
                self._normal_id[piece] = i
                self._merge_score[piece] = float(scores[i])
            elif kind == PieceType.USER_DEFINED:
                self.markers[piece] = i
            elif kind == PieceType.BYTE:
                self._byte_id[int(piece[3:5], 16)] = i
            if kind in (PieceType.CONTROL, PieceType.UNKNOWN):
                token_bytes.append(b"")
            elif kind == PieceType.BYTE:
                token_bytes.append(bytes([int(piece[3:5], 16)]))
            else:
                token_bytes.append(piece.replace(SPACE, " ").encode("utf-8"))
        self._token_bytes = token_bytes
        # Adjacent character pairs inside NORMAL pieces: where a text's neighbouring
        # characters form no such pair, no merge can ever span that boundary, so the text
        # splits there into chunks that BPE independently (and that are cached).
        self._bigrams = {p[k : k + 2] for p in self._normal_id for k in range(len(p) - 1)}
        longest_first = sorted(self.markers, key=len, reverse=True)
        self._marker_re = (
            re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        )
        self._cache: dict[str, tuple[int, ...]] = {}

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_blob(cls, blob: bytes | bytearray | memoryview) -> Tokenizer:
        """Parse a tokenizer blob; any inconsistency raises TokenizerError naming the field
        and its byte offset in the blob. The blob must end exactly after the last piece:
        the archive directory gives its exact size, so trailing bytes mean a corrupt count."""
        data = memoryview(blob).cast("B")
        size = len(data)
        if size < _HEADER.size:
            raise TokenizerError(f"tokenizer blob header: need {_HEADER.size} bytes at offset 0, "
                                 f"blob has {size}")
        *head, dummy, fallback, _pad = _HEADER.unpack_from(data, 0)
        n_pieces = head[0]
        if not 0 < n_pieces <= (size - _HEADER.size) // _PIECE.size:
            raise TokenizerError(f"tokenizer blob field n_pieces (offset 0) = {n_pieces}: "
                                 f"impossible for a {size}-byte blob")
        for k, name in enumerate(_HEADER_FIELDS[1:], start=1):
            if head[k] >= n_pieces:
                raise TokenizerError(f"tokenizer blob field {name} (offset {4 * k}) = {head[k]} "
                                     f"is outside the vocabulary of {n_pieces}")
        for value, name, off in ((dummy, "add_dummy_prefix", 20), (fallback, "byte_fallback", 21)):
            if value > 1:
                raise TokenizerError(f"tokenizer blob field {name} (offset {off}) = {value}, "
                                     "expected 0 or 1")
        pieces: list[str] = []
        scores = np.empty(n_pieces, np.float32)
        types = np.empty(n_pieces, np.uint8)
        seen: dict[str, int] = {}
        byte_seen: set[int] = set()
        off = _HEADER.size
        for i in range(n_pieces):
            where = f"tokenizer blob piece {i} (offset {off})"
            if off + _PIECE.size > size:
                raise TokenizerError(f"{where}: truncated, record header runs past the "
                                     f"{size}-byte blob")
            score, kind, length = _PIECE.unpack_from(data, off)
            start = off + _PIECE.size
            if length == 0 or start + length > size:
                raise TokenizerError(f"{where}: text length {length} at offset {off + 5} "
                                     f"is empty or runs past the {size}-byte blob")
            try:
                piece = bytes(data[start : start + length]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise TokenizerError(f"{where}: text at offset {start} is not UTF-8 "
                                     f"({exc.reason})") from None
            if kind > PieceType.BYTE:
                raise TokenizerError(f"{where}: type {kind} at offset {off + 4} is unknown")
            if math.isnan(score):
                raise TokenizerError(f"{where}: score at offset {off} is NaN")
            if piece in seen:
                raise TokenizerError(f"{where}: text {piece!r} duplicates piece {seen[piece]}")
            if kind == PieceType.BYTE:
                m = _BYTE_PIECE.fullmatch(piece)
                if m is None:
                    raise TokenizerError(f"{where}: byte piece {piece!r} is not <0xNN>")
                byte_seen.add(int(m.group(1), 16))
            seen[piece] = i
            pieces.append(piece)
            scores[i], types[i] = score, kind
            off = start + length
        if off != size:
            raise TokenizerError(f"tokenizer blob: {size - off} trailing bytes at offset {off} "
                                 f"after {n_pieces} pieces")
        if fallback and len(byte_seen) != 256:
            raise TokenizerError(f"tokenizer blob field byte_fallback (offset 21) is set but only "
                                 f"{len(byte_seen)} of 256 byte pieces are present")
        return cls(pieces, scores, types, pad_id=head[1], eos_id=head[2], bos_id=head[3],
                   unk_id=head[4], add_dummy_prefix=bool(dummy), byte_fallback=bool(fallback))

    # ------------------------------------------------------------------ encoding
    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS): README "Tokenizer" encoding.

        Every space becomes U+2581, one U+2581 is prefixed when add_dummy_prefix, markers
        (USER_DEFINED pieces) are split out longest-first left to right, and each run in
        between is BPE-encoded. A literal U+2581 in `text` is indistinguishable from a space.
        """
        if not text:
            return []
        text = text.replace(" ", SPACE)
        if self.add_dummy_prefix:
            text = SPACE + text
        ids: list[int] = []
        pos = 0
        if self._marker_re is not None:
            for m in self._marker_re.finditer(text):
                if m.start() > pos:
                    self._encode_run(text[pos : m.start()], ids)
                ids.append(self.markers[m.group()])
                pos = m.end()
        if pos < len(text):
            self._encode_run(text[pos:], ids)
        if not self.byte_fallback and self.unk_id in ids:
            # SentencePiece merges a run of unknown pieces into one (PopulateSentencePieceText).
            ids = [t for k, t in enumerate(ids) if t != self.unk_id or k == 0 or
                   ids[k - 1] != self.unk_id]
        return ids

    def _encode_run(self, run: str, out: list[int]) -> None:
        """Append the ids of one marker-free run, chunk by chunk (see `_bigrams`)."""
        bigrams, cache = self._bigrams, self._cache
        start = 0
        for k in range(1, len(run) + 1):
            if k < len(run) and run[k - 1 : k + 1] in bigrams:
                continue
            chunk = run[start:k]
            start = k
            hit = cache.get(chunk)
            if hit is None:
                if len(cache) >= _CACHE_LIMIT:
                    cache.clear()
                hit = cache[chunk] = self._bpe(chunk)
            out.extend(hit)

    def _bpe(self, chunk: str) -> tuple[int, ...]:
        """SentencePiece BPE: start from code points, repeatedly merge the adjacent pair whose
        concatenation is a NORMAL piece of highest score, leftmost on ties. A heap of
        candidate pairs over a linked list of symbols keeps it O(n log n); a heap entry is
        stale when its left symbol's current right neighbour no longer completes it."""
        merge_score = self._merge_score
        syms = list(chunk)
        n = len(syms)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        nxt[-1] = -1
        heap = []
        for i in range(n - 1):
            cand = syms[i] + syms[i + 1]
            score = merge_score.get(cand)
            if score is not None:
                heap.append((-score, i, cand))
        heapq.heapify(heap)
        while heap:
            _, left, cand = heapq.heappop(heap)
            right = nxt[left]
            if right < 0 or not syms[left] or syms[left] + syms[right] != cand:
                continue
            syms[left], syms[right] = cand, ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
                pair = cand + syms[after]
                score = merge_score.get(pair)
                if score is not None:
                    heapq.heappush(heap, (-score, left, pair))
            before = prv[left]
            if before >= 0:
                pair = syms[before] + cand
                score = merge_score.get(pair)
                if score is not None:
                    heapq.heappush(heap, (-score, before, pair))
        ids: list[int] = []
        normal_id = self._normal_id
        i = 0
        while i >= 0:
            sym = syms[i]
            tid = normal_id.get(sym)
            if tid is not None:
                ids.append(tid)
            elif self.byte_fallback:  # an unmerged symbol is one code point: its UTF-8 bytes
                try:
                    ids.extend(self._byte_id[b] for b in sym.encode("utf-8"))
                except UnicodeEncodeError:
                    raise TokenizerError(f"cannot encode lone surrogate {sym!r}") from None
            else:
                ids.append(self.unk_id)
            i = nxt[i]
        return tuple(ids)

    # ------------------------------------------------------------------ decoding
    def token_bytes(self, token_id: int) -> bytes:
        """Bytes one token contributes to decoded text: U+2581 as b" ", a byte piece its byte,
        CONTROL/UNKNOWN nothing. Decoding also drops one leading space of the whole output
        when add_dummy_prefix (the dummy prefix), which this per-token view does not."""
        return self._token_bytes[self._check_id(token_id)]

    def all_token_bytes(self) -> list[bytes]:
        """`token_bytes` of every id, indexed by id (a fresh list)."""
        return list(self._token_bytes)

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """Concatenated `token_bytes`, minus one leading space when add_dummy_prefix."""
        table = self._token_bytes
        out = b"".join([table[self._check_id(t)] for t in ids])
        if self.add_dummy_prefix and out.startswith(b" "):
            out = out[1:]
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids` (README "Tokenizer" decoding); invalid UTF-8 gives U+FFFD per byte.

        Unlike SentencePiece's decoder, UNKNOWN pieces decode to nothing (SentencePiece
        writes " \u2047 ") and the dropped leading space may come from a `<0x20>` byte piece
        (SentencePiece only strips it from the first non-byte piece). Neither case arises
        for ids this encoder produces."""
        return _utf8_replace(self.decode_bytes(ids))

    def _check_id(self, token_id: int) -> int:
        try:
            k = operator.index(token_id)
        except TypeError:
            raise TokenizerError(f"token id {token_id!r} is not an integer") from None
        if not 0 <= k < self.vocab_size:
            raise TokenizerError(f"token id {k} is outside the vocabulary [0, {self.vocab_size})")
        return k

    # ------------------------------------------------------------------ lookups
    def piece_to_id(self, piece: str) -> int:
        """Id of a piece by its exact text (any type, e.g. "<s>", "<0x0A>", "\u2581the")."""
        try:
            return self._ids[piece]
        except KeyError:
            raise UnknownPieceError(f"piece {piece!r} is not in the vocabulary") from None

    def id_to_piece(self, token_id: int) -> str:
        """Text of a piece as stored in the blob (spaces as U+2581)."""
        return self.pieces[self._check_id(token_id)]

    def marker_id(self, text: str) -> int:
        """Id of a chat marker (USER_DEFINED piece) such as "<|im_start|>" or "<tool_call>"."""
        return marker_in(self.markers, text, "a user-defined piece")

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, markers={len(self.markers)}, "
                f"add_dummy_prefix={self.add_dummy_prefix}, byte_fallback={self.byte_fallback})")
