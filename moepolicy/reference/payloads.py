"""What each wire format puts on DeepEP's wire, as bytes in its layout.

DeepEP's normal dispatch carries rows and their scales as bytes (FACTS: a bare fp8 tensor with no
scales is carried as bytes; scales arrive row-major with their tokens), so a transport check needs
payloads in each format's layout, not meaningful values: random bytes find any byte moved or lost.

Layouts for rows of ``hidden`` values:

==================  ======================  ===========================================
format              row (viewed as fp8)     scales per row
==================  ======================  ===========================================
bf16                hidden bf16             none
fp8 block-G f32     hidden bytes            ceil(hidden/G) float32
fp8 block-G ue8m0   hidden bytes            ceil(ceil(hidden/G)/4) int32 (4 exponents)
fp8 per-token       hidden bytes            1 float32
fp8 per-tensor      hidden bytes            1 float32, one value broadcast (stride 0)
fp8 bare            hidden bytes            none (a static scale the receiver knows)
nvfp4               hidden/2 bytes          hidden/16 e4m3 bytes viewed as float32
==================  ======================  ===========================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moepolicy.wire import Wire


@dataclass(frozen=True)
class PayloadFormat:
    """One wire format's layout: ``kind`` names the rows, ``scales`` the scale columns."""

    name: str
    kind: str  # bf16 | fp8 | nvfp4
    scales: str  # none | block_f32 | block_ue8m0 | token | tensor | nvfp4
    group: int = 128

    def row_bytes(self, hidden: int) -> int:
        return {"bf16": 2 * hidden, "fp8": hidden, "nvfp4": hidden // 2}[self.kind]

    def scale_columns(self, hidden: int) -> tuple[int, Optional[str]]:
        """(scale columns per row, their torch dtype's name), ``(0, None)`` without scales."""
        groups = -(-hidden // self.group)
        return {
            "none": (0, None),
            "block_f32": (groups, "float32"),
            "block_ue8m0": (-(-groups // 4), "int32"),
            "token": (1, "float32"),
            "tensor": (1, "float32"),
            "nvfp4": (hidden // 16 // 4, "float32"),
        }[self.scales]


BF16 = PayloadFormat("bf16", "bf16", "none")
NVFP4 = PayloadFormat("nvfp4 + e4m3 scales", "nvfp4", "nvfp4", 16)
MXFP8 = PayloadFormat("fp8 block-32 + packed ue8m0 (MXFP8)", "fp8", "block_ue8m0", 32)


def format_of(wire: Wire) -> Optional[PayloadFormat]:
    """The payload layout of ``wire``; None for a wire with nothing on DeepEP's wire (``none``)."""
    if wire.dtype == "bf16":
        return BF16
    if wire.dtype == "nvfp4":
        return NVFP4
    if wire.dtype != "fp8_e4m3":
        return None
    scale = wire.scale
    if scale is None:
        return PayloadFormat("fp8, no scales (static)", "fp8", "none")
    if scale.granularity == "block":
        group = scale.group or 128
        if scale.dtype == "ue8m0":
            return PayloadFormat(f"fp8 block-{group} + packed ue8m0", "fp8", "block_ue8m0", group)
        return PayloadFormat(f"fp8 block-{group} + float32", "fp8", "block_f32", group)
    if scale.granularity == "token":
        return PayloadFormat("fp8 per-token + [T,1] float32", "fp8", "token")
    return PayloadFormat("fp8 per-tensor + [T,1] stride-0", "fp8", "tensor")


@dataclass(frozen=True)
class PatternedRows:
    """One sender's rows (``part="rows"``) or scales (``part="scales"``) in ``fmt``'s layout, each
    byte a function of (sender, token, column): a byte moved to another row or column, lost or
    altered changes it. Rows are made only for the tokens asked for (``rows[token_ids]``), so a
    receiver can build what every sender sent it without anyone sending all of it."""

    fmt: PayloadFormat
    hidden: int
    source: int
    tokens: int
    part: str = "rows"

    def __getitem__(self, token_ids):
        import torch

        token_ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1).cpu()
        if self.part == "rows":
            raw = _pattern(self.source, token_ids, self.fmt.row_bytes(self.hidden), salt=1)
            return (
                raw.view(torch.bfloat16)
                if self.fmt.kind == "bf16"
                else raw.view(torch.float8_e4m3fn)
            )
        columns, dtype = self.fmt.scale_columns(self.hidden)
        if self.fmt.scales == "tensor":  # one scale per sender
            token_ids = torch.zeros_like(token_ids)
        return _pattern(self.source, token_ids, columns * 4, salt=2).view(getattr(torch, dtype))

    def all(self):
        """Every token's rows, as the sender hands them to dispatch (per-tensor scales broadcast
        without a copy, as a sender expands one scale)."""
        import torch

        if self.part == "scales" and self.fmt.scales == "tensor":
            return self[torch.zeros(1, dtype=torch.int64)].expand(self.tokens, 1)
        return self[torch.arange(self.tokens)]


def patterned_payload(fmt: PayloadFormat, tokens: int, hidden: int, source: int):
    """(rows, scales or None) that ``source`` sends, as lazily made :class:`PatternedRows`."""
    has_scales = fmt.scale_columns(hidden)[1] is not None
    return (
        PatternedRows(fmt, hidden, source, tokens),
        PatternedRows(fmt, hidden, source, tokens, "scales") if has_scales else None,
    )


def _pattern(source: int, token_ids, width: int, salt: int):
    """Byte ``c`` of the row for ``token`` is ``column(c) * a + b`` (mod 256), ``a`` odd and ``b``
    drawn from (source, token): a row moved to another token or sender, or bytes moved along it,
    changes it. Byte arithmetic keeps a preflight's reference cheap on the CPU."""
    import torch

    mixed = (token_ids * 1_000_003 + source * 104_729 + salt) * 2_654_435_761
    a = ((mixed >> 17) & 0x7F).to(torch.uint8) * 2 + 1  # odd: a bijection on byte values
    b = ((mixed >> 29) & 0xFF).to(torch.uint8)
    return _columns(width, salt)[None, :] * a[:, None] + b[:, None]


def _columns(width: int, salt: int):
    import torch

    return (
        (((torch.arange(width, dtype=torch.int64) * 7_919 + salt) * 2_654_435_761) >> 13) & 0xFF
    ).to(torch.uint8)
