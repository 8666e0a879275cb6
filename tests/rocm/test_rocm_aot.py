"""Every candidate the search emits for the five bench workloads at CI size (float16),
searched with each AMD target's DeviceSpec, printed as the ROCm backend prints it and
compiled ahead of time with Triton's AMD backend for that target, on this GPU-less machine:
a code object (hsaco, an ELF) per kernel, MFMA (CDNA) or WMMA (RDNA3) instructions wherever
the kernel has a ``tl.dot``, registers and LDS read from the code object and within the
target's limits."""

from __future__ import annotations

from typing import Any

import pytest
import rocm_cases

import yirage_triton
from yirage_rocm import RocmBackend, _device_spec

pytestmark = pytest.mark.skipif(
    not (rocm_cases.have("triton") and rocm_cases.have("torch")),
    reason="torch and triton are not installed (pip install torch triton runs these tests)",
)

CASES = [(t, w) for t in rocm_cases.TARGET_DEVICE for w in rocm_cases.SMALL]


def _printer(device: str) -> Any:
    from yirage_rocm import RocmBackend

    return RocmBackend(interpret=True), _device_spec.KNOWN_DEVICES[device]


@pytest.mark.parametrize("target,name", CASES, ids=[f"{t}-{w}" for t, w in CASES])
def test_every_candidate_compiles_for_the_amd_target(target: str, name: str) -> None:
    device = rocm_cases.TARGET_DEVICE[target]
    backend, spec = _printer(device)
    aot = yirage_triton.aot_target(target)
    assert aot.warp_size == spec.warp_size  # wave64 on CDNA, wave32 on RDNA3
    _, cands = rocm_cases.candidates(name, "float16", device)
    assert cands, "the search returned no candidate"
    compiled = 0
    for i, cand in enumerate(cands):
        plan = cand.kernel_plan()
        src = yirage_triton.generate_triton(plan, backend.export_options(spec))
        path = yirage_triton.write_triton_module(src.text, src.codegen_version)
        module = yirage_triton.load_triton_module(path)
        dtypes = {b.id: b.dtype for b in src.plan.buffers}
        label = f"{name} candidate {i} ({cand.label})"
        kernels = yirage_triton.compile_for(
            module, dtypes, target, candidate=label, allow_spills=True
        )
        spilled = [k.name for k in kernels.values() if k.registers.get("vgpr_spill", 0)]
        if spilled:  # register overflow: refused by default, naming candidate and limit
            with pytest.raises(yirage_triton.ResourceError) as err:
                yirage_triton.compile_for(module, dtypes, target, candidate=label)
            assert label in str(err.value) and f"of the {aot.max_vgprs} VGPRs" in str(err.value)
        assert set(kernels) == {k.name for k in src.plan.generated}
        generated = {k.name: k for k in src.plan.generated}
        for k in kernels.values():
            # an ELF code object for EM_AMDGPU (224) holding the kernel, for this processor
            assert k.binary[:4] == b"\x7fELF" and int.from_bytes(k.binary[18:20], "little") == 224
            assert f"\n{k.name}:" in k.assembly and f'-{target}"' in k.assembly.split("\n", 1)[0]
            assert k.registers["vgpr"] > 0 and k.registers["sgpr"] > 0
            assert k.shared <= aot.lds_bytes
            # a safe-softmax kernel also compiles without multiply-add contraction
            softmax = bool(generated[k.name].safe_softmax)
            exact = {"enable_fp_fusion": False} if softmax else {}
            assert k.options == {**dict(backend.target.compile_options), **exact}
            if "tl.dot(" in getattr(module, k.name).src:
                assert k.matrix_instructions, (k.name, "no matrix-core instruction")
            else:
                assert not k.matrix_instructions
            rocm_cases.RESOURCES.append(
                f"{target} {name} c{i} {k.name}: LDS {k.shared} B, VGPR {k.registers['vgpr']}, "
                f"AGPR {k.registers.get('agpr', 0)}, SGPR {k.registers['sgpr']}, spills "
                f"{k.registers.get('vgpr_spill', 0)}, scratch {k.registers.get('scratch_bytes', 0)}"
                f" B, {k.num_warps} waves, {k.num_stages} stages, "
                f"{', '.join(k.matrix_instructions) or 'no dot'}"
            )
            compiled += 1
    print(f"{target} {name}: {len(cands)} candidates, {compiled} kernels compiled")


class _OnMI300X(RocmBackend):
    """The ROCm backend as it prints on an MI300X (its live printings), without the GPU."""

    def live_device_spec(self) -> Any:
        return _device_spec.MI300X


@pytest.mark.parametrize("name", list(rocm_cases.SMALL))
def test_every_printing_compiles_for_gfx942(name: str) -> None:
    """Every further printing an MI300X would race (split, deep, fine, scaled …) of every
    candidate compiles for gfx942 within its limits too (the split ones with their arrival
    counters and in-kernel combine)."""
    backend = _OnMI300X()
    _, cands = rocm_cases.candidates(name, "float16")
    printed = 0
    for i, cand in enumerate(cands):
        source = backend.codegen(cand.kernel_plan())
        for variant, src in source.triton_variants.items():
            if not src.plan.generated:  # the baseline printed as eager runs it: no kernels
                assert variant == "triton_eager"
                continue
            module = yirage_triton.load_triton_module(
                yirage_triton.write_triton_module(src.text, src.codegen_version)
            )
            kernels = yirage_triton.compile_for(
                module,
                {b.id: b.dtype for b in src.plan.buffers},
                "gfx942",
                candidate=f"{name} candidate {i} {variant}",
            )
            assert kernels and all(k.binary[:4] == b"\x7fELF" for k in kernels.values())
            printed += 1
    print(f"{name}: {printed} further printings compiled for gfx942")
