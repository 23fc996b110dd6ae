"""Decoding the target's hidden states returned for EAGLE-style drafters.

A session opened with ``hidden_states={"layers": [...]}`` gets, in every VerifyResult, a
``HiddenStates`` message for the tokens that call committed (the pending token, then the
accepted nodes, in order): ``num_tokens`` x ``len(layers)`` x ``hidden_size`` values,
row-major [token][layer][hidden], little-endian, bf16 (default) or fp32. Layer L is the
residual stream after decoder layer L (0-based).

These helpers read any object with those attributes, so they work whichever verify.proto
the stubs were built from.
"""

from __future__ import annotations

import array
import struct
import sys
from typing import Any, List, Optional, Tuple

__all__ = [
    "hidden_states_dtype",
    "hidden_states_shape",
    "hidden_states_to_lists",
    "hidden_states_to_numpy",
    "hidden_states_to_torch",
]

# Enum numbers of verify.v1.HiddenDtype when the stubs do not define it.
_DEFAULT_DTYPE_NAMES = {0: "HIDDEN_DTYPE_BF16", 1: "HIDDEN_DTYPE_FP32"}


def hidden_states_dtype(hs: Any) -> str:
    """ "bf16" or "fp32"."""
    value = hs.dtype
    name = value if isinstance(value, str) else None
    if name is None:
        try:
            from ._proto import verify_pb2 as pb

            name = pb.HiddenDtype.Name(value)
        except (AttributeError, ValueError, ImportError):
            name = _DEFAULT_DTYPE_NAMES.get(int(value), "")
    name = name.upper()
    if "FP32" in name or "FLOAT32" in name:
        return "fp32"
    if "BF16" in name or "UNSPECIFIED" in name:
        return "bf16"
    raise ValueError(f"unknown hidden-state dtype {value!r}")


def hidden_states_shape(hs: Any) -> Tuple[int, int, int]:
    """(num_tokens, num_layers, hidden_size), checked against the data's length."""
    shape = (int(hs.num_tokens), len(hs.layers), int(hs.hidden_size))
    width = 4 if hidden_states_dtype(hs) == "fp32" else 2
    want = shape[0] * shape[1] * shape[2] * width
    if len(hs.data) != want:
        raise ValueError(
            f"hidden states: {len(hs.data)} bytes, expected {want} for shape {shape} "
            f"({hidden_states_dtype(hs)})"
        )
    return shape


def hidden_states_to_numpy(hs: Any) -> "Any":
    """A float32 numpy array [num_tokens, num_layers, hidden_size] (needs numpy)."""
    import numpy as np

    shape = hidden_states_shape(hs)
    if hidden_states_dtype(hs) == "fp32":
        flat = np.frombuffer(hs.data, dtype="<f4").astype(np.float32)
    else:  # bf16: the upper half of a float32
        flat = (np.frombuffer(hs.data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return flat.reshape(shape)


def hidden_states_to_torch(hs: Any, device: Optional[Any] = None) -> "Any":
    """A torch tensor [num_tokens, num_layers, hidden_size] in the data's own dtype:
    ``torch.bfloat16`` for bf16 (the bytes reinterpreted, no float32 round trip) and
    ``torch.float32`` for fp32; on ``device`` when given (needs torch)."""
    import torch

    shape = hidden_states_shape(hs)
    dtype = torch.float32 if hidden_states_dtype(hs) == "fp32" else torch.bfloat16
    # One copy into a writable buffer (torch.frombuffer warns on read-only bytes).
    buf = bytearray(hs.data)
    if sys.byteorder != "little":  # the wire format is little-endian
        words = array.array("H" if dtype == torch.bfloat16 else "I", buf)
        words.byteswap()
        buf = bytearray(words.tobytes())
    flat = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
    out = flat.reshape(shape)
    return out if device is None else out.to(device)


def hidden_states_to_lists(hs: Any) -> List[List[List[float]]]:
    """The same values as nested lists [token][layer][hidden], without numpy."""
    tokens, layers, hidden = hidden_states_shape(hs)
    n = tokens * layers * hidden
    if hidden_states_dtype(hs) == "fp32":
        flat = struct.unpack(f"<{n}f", hs.data)
    else:
        halves = struct.unpack(f"<{n}H", hs.data)
        flat = struct.unpack(f"<{n}f", struct.pack(f"<{n}I", *(h << 16 for h in halves)))
    row = layers * hidden
    return [
        [list(flat[t * row + i * hidden : t * row + (i + 1) * hidden]) for i in range(layers)]
        for t in range(tokens)
    ]
