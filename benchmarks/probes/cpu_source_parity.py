"""Fingerprint the C that yirage-cpu prints for every searched candidate of the bench
workloads (cpu presets, pinned reference spec, deterministic search), so two versions can be
compared: run it once per installed version and diff the JSON files.

``PYTHONPATH=<site of version A> python benchmarks/probes/cpu_source_parity.py a.json``
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import yirage as yr
import yirage_cpu
from yirage._workloads import WORKLOADS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from _pinned_spec import REFERENCE_CPU


def main(out: str) -> None:
    be = yirage_cpu.register()
    prints: dict[str, str] = {}
    for name, w in WORKLOADS.items():
        res = yr.search(
            w.graph("cpu"),
            backend="cpu",
            config=w.search_config,
            device_spec=REFERENCE_CPU,
            deterministic=True,
            cache=False,
            top_k=6,
        )
        for c in res.candidates:
            src = be.codegen(json.loads(c.kernel_plan().to_json()))
            digest = hashlib.sha256(str(src.code).encode()).hexdigest()[:16]
            prints[f"{name}: {c.label}"] = digest
    Path(out).write_text(json.dumps(prints, indent=1))
    print(f"{len(prints)} candidates")


if __name__ == "__main__":
    main(sys.argv[1])
