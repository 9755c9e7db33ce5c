"""The torch side of the state formats (``mate_kernels.formats``: one row per format, keyed by dtype name) and
the dtype tables the contract checks arguments against."""

from __future__ import annotations

import torch
from mate_kernels.formats import FORMATS

INDEX_DTYPES = (torch.int32, torch.int64)
IO_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

STATE_FORMATS = {getattr(torch, name): f for name, f in FORMATS.items()}  # torch dtype -> its format row
DTYPE_NAMES = {dt: str(dt).removeprefix("torch.") for dt in (*STATE_FORMATS, *INDEX_DTYPES)}  # the kernels' names
DTYPES = {name: dt for dt, name in DTYPE_NAMES.items()}

STATE_DTYPES = tuple(dt for dt, f in STATE_FORMATS.items() if not f.block_scaled)
# block-scaled states: each (slot, head, dim) row with its fp32 scale (mate_kernels.formats' docstring)
QUANT_STATE_DTYPES = tuple(dt for dt, f in STATE_FORMATS.items() if f.block_scaled)
# states rounded stochastically with rand_seed: a ReplaySSM checkpoint of any of them; the SSU's of the unscaled
# ones (its seed beside state_scale is FlashInfer's ValueError)
SR_STATE_DTYPES = tuple(dt for dt, f in STATE_FORMATS.items() if "stochastic" in f.rounding)
SSU_SR_STATE_DTYPES = tuple(dt for dt in SR_STATE_DTYPES if not STATE_FORMATS[dt].block_scaled)
SR_STATES = " or ".join(DTYPE_NAMES[dt] for dt in SR_STATE_DTYPES)  # their names, as the errors give them
SSU_SR_STATES = " or ".join(DTYPE_NAMES[dt] for dt in SSU_SR_STATE_DTYPES)

__all__ = [
    "DTYPES", "DTYPE_NAMES", "INDEX_DTYPES", "IO_DTYPES", "PARAM_DTYPES", "QUANT_STATE_DTYPES", "SR_STATES",
    "SR_STATE_DTYPES", "SSU_SR_STATES", "SSU_SR_STATE_DTYPES", "STATE_DTYPES", "STATE_FORMATS",
]  # fmt: skip
