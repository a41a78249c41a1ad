"""What decides whether an AOTInductor package loads on a host, checked before any shared object is
opened (prebake.engine.bundled.runtime.aoti): torch, the device, and the vector ISA its kernels need.
What the start takes when it does not load: tests/unit/test_graphs_variants.py."""

from __future__ import annotations

import pytest
import torch

from prebake.engine.bundled.runtime import aoti
from prebake.engine.common.cpu import cpu_flags

AVX512_HOST = "processor\t: 0\nflags\t\t: fpu sse avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni\n"


def _recorded(**changes) -> aoti.PackageRecord:
    return aoti.PackageRecord(
        **{"torch": torch.__version__, "device": "cpu", "cpu_isa": "AVX512 AVX512_VNNI", **changes}
    )


def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path):
    (tmp_path / "cpuinfo").write_text(AVX512_HOST + "\nprocessor\t: 1\nflags\t\t: other\n")
    assert cpu_flags(tmp_path / "cpuinfo") >= {"avx2", "avx512f", "avx512_vnni"}
    assert "other" not in cpu_flags(tmp_path / "cpuinfo")  # the first processor's line
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd sve\n")
    assert cpu_flags(tmp_path / "arm") == {"fp", "asimd", "sve"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_a_package_built_for_this_hosts_isa_and_torch_loads(tmp_path):
    (tmp_path / "cpuinfo").write_text(AVX512_HOST)
    assert aoti.platform_problem(_recorded(), device="cpu", flags=cpu_flags(tmp_path / "cpuinfo")) is None
    assert aoti.platform_problem(_recorded(cpu_isa="AVX2"), device="cpu", flags=cpu_flags(tmp_path / "cpuinfo")) is None


@pytest.mark.parametrize(
    ("recorded", "reason"),
    [
        (_recorded(cpu_isa="AMX"), "its kernels were built for vector ISA AMX and this CPU lacks amx_tile"),
        (_recorded(cpu_isa="AVX512_BF16"), "vector ISA AVX512_BF16 and this CPU lacks avx512_bf16"),
        (_recorded(cpu_isa="SVE256"), "vector ISA SVE256 and this CPU lacks sve"),
        (_recorded(cpu_isa="RVV"), "vector ISA RVV, which prebake cannot check on this CPU"),
        (_recorded(torch="2.1.0"), "it was compiled with torch 2.1.0 and this is torch"),
        (_recorded(device="cuda"), "it was compiled for cuda and the model runs on cpu"),
    ],
)
def test_a_package_this_host_cannot_run_is_refused_with_the_factor_that_differs(recorded, reason):
    problem = aoti.platform_problem(recorded, device="cpu", flags=frozenset(AVX512_HOST.split()))
    assert problem is not None and reason in problem, problem


def test_the_isa_names_inductor_records_are_all_mapped_to_cpu_flags():
    from torch._inductor import cpu_vec_isa

    picked = str(cpu_vec_isa.pick_vec_isa()).upper().split()
    assert all(isa in aoti.ISA_FLAGS for isa in picked), picked  # this host's, as Inductor names it
    assert aoti.platform_problem(_recorded(cpu_isa=" ".join(picked)), device="cpu", flags=cpu_flags()) is None


def test_a_gpu_package_is_refused_on_another_compute_capability_and_needs_no_cpu_isa():
    recorded = _recorded(device="cuda", compute_capability="90", cpu_isa="AMX")  # the bake host's CPU
    assert aoti.platform_problem(recorded, device="cuda", flags=frozenset(), capability="90") is None
    problem = aoti.platform_problem(recorded, device="cuda", flags=frozenset(), capability="80")
    assert problem == "its kernels were built for compute capability 90 and this GPU's is 80"


def test_a_model_the_archive_lacks_is_refused_before_torchs_loader_leaves_a_folder(tmp_path, monkeypatch):
    """issue 49 item 8: torch's loader makes TMPDIR/aotinductor_<random suffix> first and removes it only in its
    destructor, which a model it refuses never reaches; the archive is read first, so none is made."""
    import hashlib
    import json
    import zipfile

    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.bundled.build import model_and_cache
    from prebake.engine.bundled.runtime.shapes import StepShape

    folder = tmp_path / "tree" / aoti.AOTI_DIR
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / aoti.PACKAGE, "w") as archive:  # another model's files only
        archive.writestr("steps/data/aotinductor/prefill-b1-t16-c16/x.wrapper.so", b"\x7fELF")
        archive.writestr("steps/archive_format", "pt2")
    shape = StepShape("decode", 1, 1, 16)
    digest = hashlib.sha256((folder / aoti.PACKAGE).read_bytes()).hexdigest()
    recorded = _recorded(cpu_isa="", models=(shape.name,), sha256=digest)
    (folder / aoti.PACKAGE_FILE).write_text(json.dumps(recorded.model_dump(mode="json")))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "systemp"))
    (tmp_path / "systemp").mkdir()
    model, cache = model_and_cache(load_recipe("tiny-llama"), "fp32")
    with pytest.raises(aoti.PackageDoesNotLoad, match=f"its archive holds no model for {shape.name}"):
        aoti.load_package(model, cache, [shape], tmp_path / "tree")
    assert list((tmp_path / "systemp").iterdir()) == []
