"""PANM's fused kernels, in one room.

- `source.py`: the C source of the kernels (a Python string, so remote code carries it).
- `loader.py`: compiles it with the system C compiler, loads it through ctypes, and exposes the kernels as
  `torch.library` custom ops (`panm_hf::pointer_recurrence`, `gru_recurrence`, `normalize_rows`,
  `mode2_attention`, `masked_pool`, each with its backward); registers the Triton ports.
- `shift_recurrence.py`: the Pointer-Unit recurrence with `pointer_update="shift"` as `panm_hf::shift_recurrence`.
- `triton_port.py`, `triton_shift.py`, `triton_gru.py`, `triton_reads.py`: the Pointer-Unit recurrences
  (`"attention"`, `"shift"`), the Controller GRU and the three smaller ops in Triton (CUDA, or CPU under
  `TRITON_INTERPRET=1`); `triton_addressing.py`: the address glue (the slots' address bank, the Pointer Units'
  start) as one launch each, Triton only.
- `linear_rows.py`: PANM's small linears on 2-D rows with a hand-written backward (fewer ops, the same math).
- `dispatch.py`: decides eager or fused for every op, with the reason for each fallback in one table.

The modules that run these ops import `panm_hf.kernels.dispatch` by its absolute name: transformers' remote-code
copy follows flat relative imports only, so `copy_for_remote_code` writes this folder flat into a
`save_pretrained` folder (`kernels_<module>.py`) and points the copied imports at those files.
"""

from __future__ import annotations

import re
from pathlib import Path

# `from panm_hf.kernels[.<module>] import` in the copied modeling files
_ABSOLUTE = re.compile(r"^(\s*)from panm_hf\.kernels(?:\.(\w+))? import", re.MULTILINE)
_SIBLING = re.compile(r"^(\s*)from \.(\w+) import", re.MULTILINE)  # inside this folder: another kernels module
_PARENT = re.compile(r"^(\s*)from \.\.(\w+) import", re.MULTILINE)  # inside this folder: a panm_hf module


def _flat_name(module: str | None) -> str:
    return "kernels" if module in (None, "__init__") else f"kernels_{module}"


def copy_for_remote_code(folder: str | Path) -> None:
    """Write this folder's modules flat into `folder` (a `save_pretrained` folder holding the copied modeling
    code) and point the copied modules' imports of them there, so a `trust_remote_code` load runs the same
    kernels. A no-op in a remote-code copy, which is flat already (transformers copies it as it is)."""
    here = Path(__file__)
    if here.name != "__init__.py":
        return
    folder = Path(folder)
    for path in folder.glob("*.py"):
        text = path.read_text()
        flat = _ABSOLUTE.sub(lambda m: f"{m[1]}from .{_flat_name(m[2])} import", text)
        if flat != text:
            path.write_text(flat)
    for path in here.parent.glob("*.py"):
        text = _SIBLING.sub(lambda m: f"{m[1]}from .{_flat_name(m[2])} import", path.read_text())
        text = _PARENT.sub(r"\1from .\2 import", text)
        (folder / f"{_flat_name(path.stem)}.py").write_text(text)
