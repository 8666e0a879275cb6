"""Lower the Ascend printings of KernelPlans (JSON files named on the command line) through
Triton-Ascend's frontend and adapter; print one JSON summary. Run in a process of its own:
the Triton interpreter leaves triton.language patched in the process that used it."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    from yirage_ascend import AscendBackend
    from yirage_ascend._frontend import lower_printed_module
    from yirage_triton import load_triton_module, write_triton_module

    backend = AscendBackend(interpret=True)  # prints what the interpreter runs
    lowered: list[dict[str, object]] = []
    for path in paths:
        printed = backend.codegen(Path(path).read_text())
        for src in (printed.triton, *printed.triton_variants.values()):
            module = load_triton_module(write_triton_module(src.text, src.codegen_version))
            dtypes = {b.id: b.dtype for b in src.plan.buffers}
            for name, low in lower_printed_module(module, dtypes).items():
                lowered.append(
                    {
                        "plan": path,
                        "kernel": name,
                        "ttir_dot": "tt.dot" in low.ttir,
                        "adapter_bytes": len(low.adapter_ir),
                        "adapter_func": "func.func" in low.adapter_ir,
                    }
                )
    print(json.dumps(lowered))


if __name__ == "__main__":
    main(sys.argv[1:])
