"""The attention problem a schedule is built for: shapes, mask and tile sizes.

Everything downstream (tiles, schedules, kernels) derives from a Problem, so it rejects
impossible values here, naming the field, instead of letting them surface as wrong tiles later.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

from ..caches import memo


@dataclass(frozen=True)
class Mask:
    """Which keys a query row sees, relative to its bottom-right aligned diagonal.

    Query row i of seqlen_q sees key j of seqlen_k when
    ``i + off - left <= j <= i + off + right`` with ``off = seqlen_k - seqlen_q``
    (FlashAttention's bottom-right alignment). ``None`` means unbounded on that side:
    full = (None, None), causal = (None, 0), a sliding window = (left, right).
    """

    left: int | None = None
    right: int | None = None

    def __post_init__(self) -> None:
        for name in ("left", "right"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"mask.{name} must be a non-negative int or None, got {value!r}")

    @classmethod
    def full(cls) -> "Mask":
        return cls(None, None)

    @classmethod
    def causal(cls) -> "Mask":
        return cls(None, 0)

    @classmethod
    def window(cls, left: int, right: int) -> "Mask":
        return cls(left, right)

    @classmethod
    def parse(cls, text: str) -> "Mask":
        """'full', 'causal' or 'window:LEFT,RIGHT' (the CLI and JSON spelling)."""
        if text == "full":
            return cls.full()
        if text == "causal":
            return cls.causal()
        if text.startswith("window:"):
            try:
                left, right = (int(part) for part in text[len("window:"):].split(","))
            except ValueError:
                raise ValueError(f"mask {text!r}: expected window:LEFT,RIGHT with two ints") from None
            return cls.window(left, right)
        raise ValueError(f"mask must be 'full', 'causal' or 'window:LEFT,RIGHT', got {text!r}")

    # A window's unbounded side as the kernels hold it (sched::WindowTiling, attn/mask.cuh): a
    # bound past any sequence (2^30 keys), whose sums with a row and the diagonal stay in int32.
    UNBOUNDED = 1 << 30

    def kernel_bounds(self) -> tuple[int, int]:
        """(left, right) as a window kernel reads them, UNBOUNDED for an open side."""
        return tuple(self.UNBOUNDED if x is None else min(x, self.UNBOUNDED)
                     for x in (self.left, self.right))

    @property
    def kind(self) -> str:
        if self.left is None and self.right is None:
            return "full"
        if self.left is None and self.right == 0:
            return "causal"
        return "window"

    def __str__(self) -> str:
        if self.kind == "window":
            return f"window:{self.left},{self.right}"
        return self.kind


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Problem:
    """One attention backward problem and its tile sizes.

    q is (batch, seqlen_q, heads_q, head_dim), k and v are (batch, seqlen_k, heads_kv, head_dim);
    heads_q must be a multiple of heads_kv (GQA/MQA). ``mask`` accepts a Mask or the strings
    'full', 'causal', 'window:LEFT,RIGHT'.

    A pack (packed variable-length batch, Problem.pack): ``seqlens_q`` and ``seqlens_k`` give
    each sequence's lengths (0 allowed), batch is their number and seqlen_q / seqlen_k the
    longest (at least 1: the bounds of the tile indices). The mask applies to each sequence on
    its own (bottom-right aligned per sequence), and every tile method takes the sequence.
    """

    batch: int = 1
    heads_q: int = 1
    heads_kv: int | None = None
    seqlen_q: int = 128
    seqlen_k: int | None = None
    head_dim: int = 128
    mask: Mask | str = field(default_factory=Mask.full)
    block_m: int = 128
    block_n: int = 128
    seqlens_q: tuple[int, ...] | None = None
    seqlens_k: tuple[int, ...] | None = None

    @classmethod
    def pack(cls, seqlens_q, seqlens_k=None, **fields) -> "Problem":
        """A packed batch of sequences of these lengths (seqlens_k: the same as seqlens_q)."""
        return cls(seqlens_q=tuple(seqlens_q),
                   seqlens_k=None if seqlens_k is None else tuple(seqlens_k), **fields)

    def __post_init__(self) -> None:
        if self.seqlens_q is not None or self.seqlens_k is not None:
            self._init_pack()
        # None means "same as the query side": the common self-attention case.
        if self.heads_kv is None:
            object.__setattr__(self, "heads_kv", self.heads_q)
        if self.seqlen_k is None:
            object.__setattr__(self, "seqlen_k", self.seqlen_q)
        if isinstance(self.mask, str):
            object.__setattr__(self, "mask", Mask.parse(self.mask))
        elif not isinstance(self.mask, Mask):
            raise ValueError(f"mask must be a Mask or a string, got {self.mask!r}")
        for name in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim",
                     "block_m", "block_n"):
            _positive_int(name, getattr(self, name))
        if self.heads_q % self.heads_kv:
            raise ValueError(
                f"heads_q ({self.heads_q}) must be a multiple of heads_kv ({self.heads_kv})")

    def _init_pack(self) -> None:
        if self.seqlens_q is None:
            raise ValueError("seqlens_k needs seqlens_q (a pack gives both sides' lengths)")
        lengths = {}
        for name in ("seqlens_q", "seqlens_k"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, list):
                value = tuple(value)
            if not isinstance(value, tuple) or not value or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
                raise ValueError(f"{name} must be a non-empty sequence of non-negative ints, "
                                 f"got {value!r}")
            lengths[name] = value
        seqlens_q = lengths["seqlens_q"]
        seqlens_k = lengths.get("seqlens_k", seqlens_q)
        if len(seqlens_k) != len(seqlens_q):
            raise ValueError(f"seqlens_k has {len(seqlens_k)} sequences but seqlens_q has "
                             f"{len(seqlens_q)}")
        if self.batch not in (1, len(seqlens_q)):
            raise ValueError(f"batch is {self.batch} but the pack has {len(seqlens_q)} sequences "
                             f"(leave batch out: a pack's batch is its number of sequences)")
        for name, value in (("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k),
                            ("batch", len(seqlens_q)), ("seqlen_q", max(max(seqlens_q), 1)),
                            ("seqlen_k", max(max(seqlens_k), 1))):
            object.__setattr__(self, name, value)

    @property
    def is_pack(self) -> bool:
        return self.seqlens_q is not None

    def lengths(self, batch: int | None = None) -> tuple[int, int]:
        """(seqlen_q, seqlen_k) of sequence `batch` (every sequence's outside a pack)."""
        if self.seqlens_q is None:
            return self.seqlen_q, self.seqlen_k
        if batch is None:
            raise ValueError("a pack's tiles depend on the sequence: pass its batch index")
        return self.seqlens_q[batch], self.seqlens_k[batch]

    def sequence(self, batch: int) -> "Problem":
        """Sequence `batch` on its own: a batch-1 problem with its lengths (a pack of one where a
        length is 0, since a Problem's seqlens are otherwise positive)."""
        seqlen_q, seqlen_k = self.lengths(batch)
        fields = dict(heads_q=self.heads_q, heads_kv=self.heads_kv, head_dim=self.head_dim,
                      mask=self.mask, block_m=self.block_m, block_n=self.block_n)
        if seqlen_q and seqlen_k:
            return Problem(batch=1, seqlen_q=seqlen_q, seqlen_k=seqlen_k, **fields)
        return Problem.pack((seqlen_q,), (seqlen_k,), **fields)

    # -- tiling -------------------------------------------------------------------------------

    def num_m_blocks_of(self, batch: int | None = None) -> int:
        return _ceil_div(self.lengths(batch)[0], self.block_m)

    def num_n_blocks_of(self, batch: int | None = None) -> int:
        return _ceil_div(self.lengths(batch)[1], self.block_n)

    @property
    def num_m_blocks(self) -> int:
        return _ceil_div(self.seqlen_q, self.block_m)

    @property
    def num_n_blocks(self) -> int:
        return _ceil_div(self.seqlen_k, self.block_n)

    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head (1 without GQA)."""
        return self.heads_q // self.heads_kv

    @property
    def gqa(self) -> bool:
        return self.heads_q != self.heads_kv

    def kv_head(self, head: int) -> int:
        return head // self.group_size

    def _key_range(self, m_block: int, batch: int | None = None) -> tuple[int, int] | None:
        """Inclusive key interval seen by any row of Q tile m_block, or None if it sees none."""
        seqlen_q, seqlen_k = self.lengths(batch)
        first_row = m_block * self.block_m
        last_row = min(seqlen_q, first_row + self.block_m) - 1
        if last_row < first_row or seqlen_k == 0:
            return None
        off = seqlen_k - seqlen_q
        lo = 0 if self.mask.left is None else first_row + off - self.mask.left
        hi = seqlen_k - 1 if self.mask.right is None else last_row + off + self.mask.right
        lo, hi = max(lo, 0), min(hi, seqlen_k - 1)
        return (lo, hi) if lo <= hi else None

    def tile_kept(self, n_block: int, m_block: int, batch: int | None = None) -> bool:
        """Whether the mask keeps any (query, key) pair of this tile."""
        keys = self._key_range(m_block, batch)
        if keys is None:
            return False
        first_key = n_block * self.block_n
        last_key = min(self.lengths(batch)[1], first_key + self.block_n) - 1
        return first_key <= keys[1] and last_key >= keys[0]

    def m_blocks_of(self, n_block: int, batch: int | None = None) -> list[int]:
        """Q tiles that KV tile n_block contributes to, ascending."""
        kept = _kept_m_blocks(self, batch if self.is_pack else None)
        return list(kept[n_block]) if 0 <= n_block < len(kept) else []

    def kept_fraction(self, n_block: int, m_block: int, batch: int | None = None) -> float:
        """Fraction of the tile's (query, key) pairs the mask keeps (diagonal tiles < 1)."""
        seqlen_q, seqlen_k = self.lengths(batch)
        rows = range(m_block * self.block_m, min(seqlen_q, (m_block + 1) * self.block_m))
        first_key = n_block * self.block_n
        last_key = min(seqlen_k, first_key + self.block_n) - 1
        off = seqlen_k - seqlen_q
        kept = 0
        for i in rows:
            lo = first_key if self.mask.left is None else max(first_key, i + off - self.mask.left)
            hi = last_key if self.mask.right is None else min(last_key, i + off + self.mask.right)
            kept += max(0, hi - lo + 1)
        return kept / (self.block_m * self.block_n)

    def kv_tiles(self) -> Iterator[tuple[int, int, int]]:
        """(batch, head, n_block) of every KV tile with at least one kept task, per query head."""
        for b in range(self.batch):
            kept = [n for n, rows in enumerate(_kept_m_blocks(self, b if self.is_pack else None))
                    if rows]
            for h in range(self.heads_q):
                for n in kept:
                    yield (b, h, n)

    # -- serialization ------------------------------------------------------------------------

    def to_dict(self) -> dict:
        data = {
            "batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
            "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "head_dim": self.head_dim,
            "mask": str(self.mask), "block_m": self.block_m, "block_n": self.block_n,
        }
        if self.is_pack:
            data["seqlens_q"], data["seqlens_k"] = list(self.seqlens_q), list(self.seqlens_k)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Problem":
        if not isinstance(data, dict):
            raise ValueError(f"problem must be an object, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"problem has unknown fields: {', '.join(sorted(unknown))}")
        if data.get("seqlens_q") is not None:
            # A pack's batch and longest lengths follow from its sequences; a file that states
            # them must agree.
            problem = cls(**{k: v for k, v in data.items()
                             if k not in ("batch", "seqlen_q", "seqlen_k")})
            for name in ("batch", "seqlen_q", "seqlen_k"):
                if name in data and data[name] != getattr(problem, name):
                    raise ValueError(f"problem.{name} is {data[name]!r} but the pack's sequences "
                                     f"give {getattr(problem, name)}")
            return problem
        return cls(**data)

    def describe(self) -> str:
        heads = f"heads {self.heads_q}" + (f"/{self.heads_kv}kv" if self.gqa else "")
        if self.is_pack:
            tokens = (f"{sum(self.seqlens_q):,} tokens" if self.seqlens_q == self.seqlens_k else
                      f"{sum(self.seqlens_q):,}/{sum(self.seqlens_k):,} tokens")
            lead = (f"pack of {self.batch} sequences ({tokens}, the longest "
                    f"{self.seqlen_q}" + ("" if self.seqlens_q == self.seqlens_k
                                          else f"/{self.seqlen_k}") + ")")
            return (f"{lead}, {heads}, head_dim {self.head_dim}, {self.mask} mask, "
                    f"blocks {self.block_m}x{self.block_n}")
        seq = (f"seqlen {self.seqlen_q}" if self.seqlen_q == self.seqlen_k
               else f"seqlen {self.seqlen_q}/{self.seqlen_k}")
        return (f"batch {self.batch}, {heads}, {seq}, head_dim {self.head_dim}, {self.mask} mask, "
                f"blocks {self.block_m}x{self.block_n}")


@memo(max_entries=1024)
def _kept_m_blocks(problem: Problem, batch: int | None) -> tuple[tuple[int, ...], ...]:
    """For each n_block, the Q tiles the mask keeps with it, ascending: the same for every head
    (and outside a pack every batch), so computed once per sequence (the schedule builders and
    the verifier ask per KV tile; asking tile_kept for every (n, m) pair took seconds at 16k
    tokens). Q tile m sees keys [lo, hi], so the KV tiles lo // block_n ... hi // block_n
    (Problem.tile_kept, inverted)."""
    rows: list[list[int]] = [[] for _ in range(problem.num_n_blocks_of(batch))]
    for m in range(problem.num_m_blocks_of(batch)):
        keys = problem._key_range(m, batch)
        if keys is not None:
            for n in range(keys[0] // problem.block_n, keys[1] // problem.block_n + 1):
                rows[n].append(m)
    return tuple(map(tuple, rows))
