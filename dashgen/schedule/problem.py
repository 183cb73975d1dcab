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

    def __post_init__(self) -> None:
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

    # -- tiling -------------------------------------------------------------------------------

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

    def _key_range(self, m_block: int) -> tuple[int, int] | None:
        """Inclusive key interval seen by any row of Q tile m_block, or None if it sees none."""
        first_row = m_block * self.block_m
        last_row = min(self.seqlen_q, first_row + self.block_m) - 1
        off = self.seqlen_k - self.seqlen_q
        lo = 0 if self.mask.left is None else first_row + off - self.mask.left
        hi = self.seqlen_k - 1 if self.mask.right is None else last_row + off + self.mask.right
        lo, hi = max(lo, 0), min(hi, self.seqlen_k - 1)
        return (lo, hi) if lo <= hi else None

    def tile_kept(self, n_block: int, m_block: int) -> bool:
        """Whether the mask keeps any (query, key) pair of this tile."""
        keys = self._key_range(m_block)
        if keys is None:
            return False
        first_key = n_block * self.block_n
        last_key = min(self.seqlen_k, first_key + self.block_n) - 1
        return first_key <= keys[1] and last_key >= keys[0]

    def m_blocks_of(self, n_block: int) -> list[int]:
        """Q tiles that KV tile n_block contributes to, ascending."""
        kept = _kept_m_blocks(self)
        return list(kept[n_block]) if 0 <= n_block < len(kept) else []

    def kept_fraction(self, n_block: int, m_block: int) -> float:
        """Fraction of the tile's (query, key) pairs the mask keeps (diagonal tiles < 1)."""
        rows = range(m_block * self.block_m, min(self.seqlen_q, (m_block + 1) * self.block_m))
        first_key = n_block * self.block_n
        last_key = min(self.seqlen_k, first_key + self.block_n) - 1
        off = self.seqlen_k - self.seqlen_q
        kept = 0
        for i in rows:
            lo = first_key if self.mask.left is None else max(first_key, i + off - self.mask.left)
            hi = last_key if self.mask.right is None else min(last_key, i + off + self.mask.right)
            kept += max(0, hi - lo + 1)
        return kept / (self.block_m * self.block_n)

    def kv_tiles(self) -> Iterator[tuple[int, int, int]]:
        """(batch, head, n_block) of every KV tile with at least one kept task, per query head."""
        kept = [n for n, rows in enumerate(_kept_m_blocks(self)) if rows]
        for b in range(self.batch):
            for h in range(self.heads_q):
                for n in kept:
                    yield (b, h, n)

    # -- serialization ------------------------------------------------------------------------

    def to_dict(self) -> dict:
        return {
            "batch": self.batch, "heads_q": self.heads_q, "heads_kv": self.heads_kv,
            "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k, "head_dim": self.head_dim,
            "mask": str(self.mask), "block_m": self.block_m, "block_n": self.block_n,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Problem":
        if not isinstance(data, dict):
            raise ValueError(f"problem must be an object, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"problem has unknown fields: {', '.join(sorted(unknown))}")
        return cls(**data)

    def describe(self) -> str:
        heads = f"heads {self.heads_q}" + (f"/{self.heads_kv}kv" if self.gqa else "")
        seq = (f"seqlen {self.seqlen_q}" if self.seqlen_q == self.seqlen_k
               else f"seqlen {self.seqlen_q}/{self.seqlen_k}")
        return (f"batch {self.batch}, {heads}, {seq}, head_dim {self.head_dim}, {self.mask} mask, "
                f"blocks {self.block_m}x{self.block_n}")


@memo(max_entries=64)
def _kept_m_blocks(problem: Problem) -> tuple[tuple[int, ...], ...]:
    """For each n_block, the Q tiles the mask keeps with it, ascending: the same for every batch
    and head, so computed once per problem (the schedule builders and the verifier ask per KV
    tile; asking tile_kept for every (n, m) pair took seconds at 16k tokens). Q tile m sees keys
    [lo, hi], so the KV tiles lo // block_n ... hi // block_n (Problem.tile_kept, inverted)."""
    rows: list[list[int]] = [[] for _ in range(problem.num_n_blocks)]
    for m in range(problem.num_m_blocks):
        keys = problem._key_range(m)
        if keys is not None:
            for n in range(keys[0] // problem.block_n, keys[1] // problem.block_n + 1):
                rows[n].append(m)
    return tuple(map(tuple, rows))
