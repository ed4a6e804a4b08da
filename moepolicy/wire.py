"""What goes on the wire for one layer: dtype and, for fp8, its scales. Shared by the rule grammar
(decisions) and the runtime (lookups); plain frozen dataclasses, no pydantic, so the runtime stays light."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Scale:
    granularity: str  # block | token | tensor
    dtype: str  # float32 | ue8m0
    layout: str = "row"  # row | stride0
    group: Optional[int] = None


@dataclass(frozen=True)
class Wire:
    dtype: str  # bf16 | fp8_e4m3 | none
    scale: Optional[Scale] = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": self.dtype}
        if self.scale is not None:
            s = self.scale
            out["scale"] = {
                "granularity": s.granularity,
                **({"group": s.group} if s.group else {}),
                "dtype": s.dtype,
                "layout": s.layout,
            }
        return out
