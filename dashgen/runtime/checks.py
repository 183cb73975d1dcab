"""The argument checks dashgen.attention and dashgen.attention_varlen share, each raising the
error that names the argument: the tensors (types, ranks, dtypes, head_dims, heads, strides),
the options, the device and its compute capability, and the refusal of deterministic=False
under torch's deterministic flag. Each op runs them in the order its docstring gives (so that
a CPU machine reaches every error path) around the checks of its own layout; the two ops give
the same message for the same fault."""
from __future__ import annotations

import math
import operator
import warnings

import torch

from ..codegen.variants import check_head_dim_v, served_head_dims
from ..schedule.builders import get_builder
from .op_common import constant_for_compile
from .tables import is_table, table_of

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
REQUIRED_CAPABILITY = (9, 0)  # the kernels use wgmma/TMA/setmaxnreg, compiled for sm_90a only

# The device type the ops accept; CPU tests point it at "cpu" and fake the kernels (op._kernels).
_DEVICE_TYPE = "cuda"


@constant_for_compile
def _device_facts(index: int) -> tuple[int, int, int, str]:
    """(major, minor, SM count, name) of a CUDA device; constant for torch.compile's tracing."""
    props = torch.cuda.get_device_properties(index)
    return props.major, props.minor, props.multi_processor_count, props.name


# -- the tensors -------------------------------------------------------------------------------

def tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def rank(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D ({layout}), got shape {tuple(t.shape)}")


def dtype(q: torch.Tensor) -> None:
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"q has dtype {q.dtype}; dashgen supports torch.bfloat16 and torch.float16")


def same_dtype(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.dtype != q.dtype:
        raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; "
                        f"q, k and v must share one dtype")


def same_head_dim(name: str, t: torch.Tensor, q: torch.Tensor) -> None:
    if t.shape[-1] != q.shape[-1]:
        raise ValueError(f"{name} has head_dim {t.shape[-1]} but q has head_dim {q.shape[-1]}")


def head_dim_v(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """v as wide as q and k, or a pair with kernels (HEAD_DIM_V_PAIRS: MLA's 192/128), whose
    backward sums dK/dV per query head: no GQA there. Heads are the next-to-last dimension in
    both ops' layouts ((batch, seqlen, heads, head_dim) and a pack's (tokens, heads, head_dim))."""
    if v.shape[-1] == q.shape[-1]:
        return
    check_head_dim_v(q.shape[-1], v.shape[-1])
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"v has head_dim {v.shape[-1]} under q's {q.shape[-1]}: served with "
                         f"as many k/v heads as q heads (got {k.shape[-2]} and {q.shape[-2]}); "
                         f"grouped (GQA/MQA) heads need v as wide as q")


def heads_divide(heads_q: int, heads_kv: int) -> None:
    if heads_q % heads_kv:
        raise ValueError(f"k has {heads_kv} heads, which does not divide q's {heads_q} heads "
                         f"(heads_q must be a multiple of heads_kv for GQA/MQA)")


def head_dim(q: torch.Tensor) -> None:
    if q.shape[-1] not in served_head_dims():
        raise ValueError(f"q has head_dim {q.shape[-1]}; supported head_dims: "
                         f"{served_head_dims()}")


def last_dim_contiguous(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        # Other strides are fixed with .contiguous(); a strided last dim would mean a silent
        # full copy of the tensor, so the caller has to decide.
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (head_dim), "
                             f"got strides {tuple(t.stride())}")


# -- the options and the device ----------------------------------------------------------------

def options(causal, softmax_scale, deterministic, schedule, num_workers) -> None:
    """The options' types and values; `schedule` a name, "auto" or a loaded schedule file's
    key (a pack passes "auto" and checks its own schedules)."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise TypeError(f"softmax_scale must be a float or None, got {softmax_scale!r}")
        if not (math.isfinite(softmax_scale) and softmax_scale > 0):
            raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale!r}")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be a bool or None, got {deterministic!r}")
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a str or a dashgen.Schedule, got {schedule!r}")
    if is_table(schedule):
        table_of(schedule)  # raises ValueError for a key no loaded schedule has
    elif schedule != "auto":
        try:
            get_builder(schedule)
        except ValueError as exc:
            raise ValueError(f"schedule: {exc} (or 'auto')") from None
    if num_workers is not None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int):
            raise TypeError(f"num_workers must be an int or None, got {num_workers!r}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be positive, got {num_workers}")


def softcap(value) -> float:
    """FlashAttention's softcap as a float: 0 (no capping) or a positive, finite cap."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"softcap must be a float, got {value!r}")
    if not 0 <= value < math.inf:  # NaN compares False (math.isfinite breaks torch.compile's)
        raise ValueError(f"softcap must be 0 (no capping) or a positive, finite cap, got "
                         f"{value!r}")
    return float(value)


def _window_bound(value, window_size) -> int:
    """One bound of window_size as an int: any integer FlashAttention takes (its interface
    reads window_size[0] and [1] as ints, so an element of a 2-element integer tensor, as
    FA3's varlen tests pass, or a numpy int serves); bools and non-integers are named."""
    if not isinstance(value, bool) and getattr(value, "dtype", None) != torch.bool:
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")


def window(window_size, causal: bool, seqlen_q: int | None = None,
           seqlen_k: int | None = None) -> tuple[bool, tuple[int, int]]:
    """(causal, window) for FlashAttention's window_size and causal: window_size = (left,
    right), query row i seeing keys i + off - left .. i + off + right (off = seqlen_k -
    seqlen_q), -1 an open side; causal=True makes right 0. Given the lengths, a bound that
    removes no key is opened (left >= seqlen_k - 1: the last row sees key 0; right >= seqlen_q
    - 1: the first row sees the last key). A full or causal mask comes back as (causal, (-1,
    -1)), so it runs the kernels without a window (and their schedules); any other as (False,
    (left, right))."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size must be a pair of ints (left, right), got "
                        f"{window_size!r}") from None
    left, right = _window_bound(left, window_size), _window_bound(right, window_size)
    # FlashAttention reads any negative bound as an open side.
    left, right = max(left, -1), max(right, -1)
    if causal:
        right = 0
    if left >= 0 or right > 0:  # a window: open what removes no key (a right bound of 0 is
        # the causal mask's, kept so that one query row runs the causal kernel either way)
        if seqlen_k is not None and left >= seqlen_k - 1:
            left = -1
        if seqlen_q is not None and right > 0 and right >= seqlen_q - 1:
            right = -1
    if left < 0 and right <= 0:
        return right == 0, (-1, -1)
    return False, (left, right)


def device(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """The SM count of q's device, after checking all three are on one sm_90 CUDA device."""
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; "
                             f"q, k and v must be on one device")
    if q.device.type != _DEVICE_TYPE:
        raise ValueError(f"q, k and v are on {q.device}; dashgen needs CUDA tensors")
    major, minor, sm_count, name = _device_facts(q.device.index)
    if (major, minor) != REQUIRED_CAPABILITY:
        raise RuntimeError(f"q is on {q.device} ({name}, compute capability {major}.{minor}); "
                           f"dashgen's kernels need compute capability 9.0 (H100/H200)")
    return sm_count


def refuse_nondeterministic() -> None:
    """deterministic=False under torch.use_deterministic_algorithms(True): an error, or with
    warn_only=True a warning, as PyTorch's own non-deterministic ops do."""
    message = ("deterministic=False asks for dashgen's non-deterministic backward (unordered "
               "atomic dQ adds), but torch.use_deterministic_algorithms(True) is set; pass "
               "deterministic=None (follow the flag) or True")
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, stacklevel=3)
    else:
        raise RuntimeError(message)
