"""The host probe, against simulated hosts: a fake /proc, installed-package metadata written
to a temporary site folder, and canned nvidia-smi / hl-smi output (the tools' documented CSV
contract). Hangs and failures use real subprocesses put first on PATH."""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.keys import Key
from prebake.engine.common.host_tools import TOOL_TIMEOUT_S
from prebake.engine.common.probe import (
    HL_SMI_ARGS,
    NVIDIA_SMI_ARGS,
    Host,
    Package,
    Platform,
    Software,
    current_host,
    probe,
)
from prebake.engine.vllm.adapter import PACKAGES as VLLM_PACKAGES

REPO = Path(__file__).resolve().parents[2]
X86_AVX512 = "fpu sse sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl avx512cd"
X86_AMX = X86_AVX512 + " amx_bf16 amx_tile amx_int8"
ARM_NEOVERSE_V2 = "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics sve sve2 svebf16"


def fake_proc(tmp_path: Path, machine: str, flags: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "arch").write_text(machine + "\n")
    key = "Features" if machine == "aarch64" else "flags"
    cpu = f"processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n{key}\t\t: {flags}\n\n"
    (proc / "cpuinfo").write_text(cpu + cpu.replace(": 0", ": 1"))
    return proc


def fake_site(tmp_path: Path, packages: dict[str, str], requires: tuple[str, ...] = ()) -> list[str]:
    """A folder of .dist-info metadata, as pip leaves it; requires are torch's Requires-Dist."""
    site = tmp_path / "site-packages"
    for name, ver in packages.items():
        info = site / f"{name.replace('-', '_')}-{ver}.dist-info"
        info.mkdir(parents=True)
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {ver}"]
        if name == "torch":
            lines += [f"Requires-Dist: {r}" for r in requires]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    site.mkdir(exist_ok=True)
    return [str(site)]


def tools_on_path(tmp_path: Path, scripts: dict[str, str]) -> dict[str, str]:
    """Executables named like the vendor tools, first on PATH; returns the environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in scripts.items():
        path = bin_dir / tool
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}


class CannedTools:
    """Stands in for subprocess.run: answers each tool with its canned CSV, records the calls."""

    def __init__(self, outputs: dict[str, str | BaseException]):
        self.outputs = outputs
        self.calls: list[list[str]] = []

    def __call__(self, argv, *, capture_output, text, timeout, env):
        assert capture_output and text and timeout == TOOL_TIMEOUT_S and "PATH" in env
        self.calls.append(list(argv))
        answer = self.outputs[Path(argv[0]).name]
        if isinstance(answer, BaseException):
            raise answer
        return subprocess.CompletedProcess(argv, 0, answer, "")


def never_called(argv, **_kwargs):
    raise AssertionError(f"no tool is on PATH, yet {argv} was run")


def cpu_host(tmp_path: Path, flags: str = X86_AVX512, machine: str = "x86_64") -> Host:
    return probe(
        proc_root=fake_proc(tmp_path, machine, flags),
        run=never_called,
        env={"PATH": str(tmp_path / "empty")},
        metadata_path=fake_site(tmp_path, {"torch": "2.13.0+cpu"}),
    )


def h100_host(
    tmp_path: Path, name: str = "NVIDIA H100 80GB HBM3", capability: str = "9.0", torch: str = "2.8.0+cu128"
) -> tuple[Host, CannedTools]:
    tools = CannedTools({"nvidia-smi": f"{name}, {capability}, 550.54.15\n" * 8})
    host = probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512),
        run=tools,
        env=tools_on_path(tmp_path, {"nvidia-smi": "exit 99"}),
        metadata_path=fake_site(tmp_path, {"torch": torch, "triton": "3.4.0", "vllm": "0.32.0"}),
        packages=VLLM_PACKAGES,
    )
    return host, tools


def gaudi_host(tmp_path: Path, product: str = "HL-325L", plugin: bool = True) -> Host:
    packages = {"torch": "2.6.0+hpu.1.21.0.555"} | ({"habana-torch-plugin": "1.21.0.555"} if plugin else {})
    return probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AMX),
        run=CannedTools({"hl-smi": f"{product}, 1.21.0-ca59b5a\n" * 8}),
        env=tools_on_path(tmp_path, {"hl-smi": "exit 99"}),
        metadata_path=fake_site(tmp_path, packages),
    )


# --- what a host is ------------------------------------------------------------------------


def test_avx512_cpu_host_is_keyed_by_its_isa_not_its_model_name(tmp_path):
    host = cpu_host(tmp_path)

    assert host.platform == Platform("cpu", "x86_64+avx512", "", 1, ("avx2", "avx512"))
    assert host.platform.factors() == {
        "device": "cpu",
        "arch": "x86_64+avx512",
        "device_name": "",
        "isa": "avx2,avx512",
    }
    assert host.software.torch == "2.13.0+cpu"
    assert (host.software.cuda_runtime, host.software.driver, host.software.triton) == (None, None, None)
    assert host.notes == ()


def test_amx_host_names_amx_as_its_highest_level(tmp_path):
    platform = cpu_host(tmp_path, X86_AMX).platform

    assert (platform.arch, platform.isa) == ("x86_64+amx", ("amx", "avx2", "avx512"))


def test_avx512f_without_bw_vl_dq_is_not_an_avx512_host(tmp_path):
    platform = cpu_host(tmp_path, "fpu sse avx avx2 fma avx512f avx512pf avx512er").platform

    assert (platform.arch, platform.isa) == ("x86_64+avx2", ("avx2",))


def test_aarch64_host_reads_sve_levels_from_features(tmp_path):
    platform = cpu_host(tmp_path, ARM_NEOVERSE_V2, machine="aarch64").platform

    assert (platform.arch, platform.isa) == ("aarch64+sve2", ("neon", "sve", "sve2"))


def test_missing_cpuinfo_is_a_bare_machine_with_a_note(tmp_path):
    proc = fake_proc(tmp_path, "x86_64", X86_AVX512)
    (proc / "cpuinfo").unlink()

    host = probe(proc_root=proc, run=never_called, env={"PATH": ""}, metadata_path=[])

    assert host.platform.arch == "x86_64" and host.platform.isa == ()
    assert "cpuinfo" in host.notes[0]


def test_h100_host_is_sm_90_with_its_cuda_build(tmp_path):
    host, tools = h100_host(tmp_path)

    assert host.platform == Platform("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 8, ("avx2", "avx512"))
    assert host.platform.factors() == {"device": "cuda", "arch": "sm_90", "device_name": "NVIDIA H100 80GB HBM3"}
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    packages = (("vllm", "0.32.0"), ("vllm_gaudi", None))  # the vLLM adapter's declared packages
    assert host.software == Software(python, "2.8.0+cu128", "3.4.0", None, "12.8", "550.54.15", packages=packages)
    assert host.software.factors()["driver"] == "550"
    assert [call[1:] for call in tools.calls] == [list(NVIDIA_SMI_ARGS)]


def test_untagged_torch_takes_its_cuda_runtime_from_its_requirement_pin(tmp_path):
    site = fake_site(
        tmp_path,
        {"torch": "2.5.1"},
        requires=(
            'nvidia-cuda-runtime-cu12==12.4.127; platform_system == "Linux" and platform_machine == "x86_64"',
            "filelock",
        ),
    )

    host = probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512), run=never_called, env={"PATH": ""}, metadata_path=site
    )

    assert host.software.cuda_runtime == "12.4"


def test_blackwell_compute_capability_reads_as_sm_120(tmp_path):
    host, _ = h100_host(tmp_path, name="NVIDIA RTX PRO 6000 Blackwell", capability="12.0")

    assert host.platform.arch == "sm_120"


def test_mixed_gpu_host_is_described_by_gpu_0_with_a_note(tmp_path):
    tools = CannedTools(
        {"nvidia-smi": "NVIDIA H100 80GB HBM3, 9.0, 550.54.15\nNVIDIA A100-SXM4-80GB, 8.0, 550.54.15\n"}
    )

    host = probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512),
        run=tools,
        env=tools_on_path(tmp_path, {"nvidia-smi": "exit 99"}),
        metadata_path=[],
    )

    assert (host.platform.arch, host.platform.device_count) == ("sm_90", 1)
    assert "mixes GPU models" in host.notes[0]


def test_gaudi3_host_carries_the_habana_stack_and_driver(tmp_path):
    host = gaudi_host(tmp_path)

    assert host.platform == Platform("gaudi", "gaudi3", "HL-325L", 8, ("amx", "avx2", "avx512"))
    assert host.software.habana == "1.21.0.555"
    assert host.software.driver == "1.21.0-ca59b5a"
    assert host.software.factors()["driver"] == "1.21.0-ca59b5a"
    assert host.software.cuda_runtime is None


@pytest.mark.parametrize(
    ("product", "generation"),
    [("HL-205", "gaudi"), ("HL-225", "gaudi2"), ("HL-225B", "gaudi2"), ("HL-325", "gaudi3"), ("HL-338", "gaudi3")],
)
def test_gaudi_products_map_to_their_generation(tmp_path, product, generation):
    assert gaudi_host(tmp_path, product).platform.arch == generation


def test_unknown_gaudi_product_is_keyed_by_its_own_name(tmp_path):
    host = gaudi_host(tmp_path, "HL-425X")

    assert host.platform.arch == "hl-425x"
    assert "unknown Gaudi product" in host.notes[0]


def test_hl_smi_is_asked_its_documented_query(tmp_path):
    tools = CannedTools({"hl-smi": "HL-225, 1.21.0-ca59b5a\n"})

    probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AMX),
        run=tools,
        env=tools_on_path(tmp_path, {"hl-smi": "exit 99"}),
        metadata_path=[],
    )

    assert [call[1:] for call in tools.calls] == [list(HL_SMI_ARGS)]


def test_habana_plugin_without_a_card_is_a_cpu_host_with_a_note(tmp_path):
    host = probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AMX),
        run=never_called,
        env={"PATH": ""},
        metadata_path=fake_site(tmp_path, {"habana-torch-plugin": "1.21.0.555"}),
    )

    assert host.platform.device == "cpu"
    assert "no Gaudi device" in host.notes[0]


# --- keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize("make", [cpu_host, lambda p: h100_host(p)[0], gaudi_host])
def test_factors_carry_no_hostnames_or_paths(tmp_path, make):
    host = make(tmp_path)
    values = [v for group in host.factors().values() for v in group.values()]

    assert all(isinstance(v, str) for v in values)
    assert not any(os.path.isabs(v) or str(tmp_path) in v for v in values)
    assert socket.gethostname() not in values
    Key.of("graphs", host.factors())  # the key constructor itself refuses path-like factors


def test_cpu_isa_stays_out_of_accelerator_keys(tmp_path):
    host, _ = h100_host(tmp_path)

    assert "isa" not in host.platform.factors()


# --- what a host can build -----------------------------------------------------------------


def test_fp8_on_a_cpu_host_builds_as_torch_runs_fp8_matmuls_on_every_cpu(tmp_path):
    ok, _ = cpu_host(tmp_path).can_build("cpu", "fp8")

    assert ok


def test_bf16_on_a_cpu_host_builds(tmp_path):
    assert cpu_host(tmp_path).can_build("cpu", "bf16") == (True, "this host (cpu x86_64+avx512) builds cpu bf16")


def test_cuda_artifacts_are_refused_on_a_cpu_host(tmp_path):
    ok, reason = cpu_host(tmp_path).can_build("cuda", "bf16")

    assert not ok and "this host is cpu x86_64+avx512" in reason


@pytest.mark.parametrize(
    ("capability", "dtype", "ok"),
    [
        ("9.0", "fp8", True),
        ("8.9", "fp8", True),
        ("8.0", "fp8", False),
        ("8.0", "bf16", True),
        ("7.0", "bf16", False),
        ("7.0", "fp16", True),
        ("10.0", "fp8", True),
    ],
)
def test_cuda_dtypes_follow_compute_capability(tmp_path, capability, dtype, ok):
    host, _ = h100_host(tmp_path, capability=capability)

    built, reason = host.can_build("cuda", dtype)

    assert built is ok
    assert ok or f"sm_{capability.replace('.', '')}" in reason


def test_cuda_build_refused_when_torch_is_a_cpu_build(tmp_path):
    host, _ = h100_host(tmp_path, torch="2.13.0+cpu")

    ok, reason = host.can_build("cuda", "bf16")

    assert not ok and "2.13.0+cpu is not a CUDA build" in reason


def test_fp8_builds_on_gaudi3_and_needs_the_habana_stack(tmp_path):
    assert gaudi_host(tmp_path / "a").can_build("gaudi", "fp8")[0]
    ok, reason = gaudi_host(tmp_path / "b", plugin=False).can_build("gaudi", "bf16")
    assert not ok and "habana-torch-plugin" in reason


def test_nothing_builds_without_torch(tmp_path):
    host = probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512), run=never_called, env={"PATH": ""}, metadata_path=[]
    )

    ok, reason = host.can_build("cpu", "fp32")

    assert not ok and "torch is not installed" in reason


def test_unknown_device_or_dtype_is_refused_with_the_known_ones(tmp_path):
    host = cpu_host(tmp_path)

    assert host.can_build("tpu", "bf16") == (False, "unknown device 'tpu'; prebake builds for cpu, cuda, gaudi")
    assert host.can_build("cpu", "int4") == (False, "unknown dtype 'int4'; prebake builds fp32, bf16, fp16, fp8")


def test_platform_refuses_an_unknown_device():
    with pytest.raises(ValueError, match="tpu"):
        Platform("tpu", "v5e", "", 1, ())


# --- a probe never fails the caller ----------------------------------------------------------


def test_hanging_nvidia_smi_is_no_gpu_and_leaves_nothing_running(tmp_path):
    # The fake tool hangs in a child of its own, as a wrapper script around the real one would:
    # the time box must end that child too, not only the shell.
    pid_file = tmp_path / "child.pid"
    env = tools_on_path(tmp_path, {"nvidia-smi": f"sleep 30 & echo $! > {pid_file}; wait"})

    started = time.monotonic()
    host = probe(proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512), env=env, metadata_path=[])
    elapsed = time.monotonic() - started

    assert elapsed < TOOL_TIMEOUT_S + 2
    assert host.platform.device == "cpu"
    assert any("nvidia-smi did not answer" in note for note in host.notes)
    assert ended(int(pid_file.read_text()))


def ended(pid: int, within_s: float = 2.0) -> bool:
    """The process is gone or a zombie (killed, waiting for whoever reaps orphans)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_failing_nvidia_smi_is_no_gpu_and_says_why(tmp_path):
    env = tools_on_path(
        tmp_path,
        {
            "nvidia-smi": textwrap.dedent("""\
        echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
        exit 9""")
        },
    )

    host = probe(proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512), env=env, metadata_path=[])

    assert host.platform.device == "cpu"
    assert host.notes == (
        "nvidia-smi exited 9 (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.); "
        "assuming no such device",
    )


def test_real_tool_output_is_read_through_the_default_runner(tmp_path):
    env = tools_on_path(tmp_path, {"nvidia-smi": 'echo "NVIDIA L4, 8.9, 570.86.15"; echo "NVIDIA L4, 8.9, 570.86.15"'})

    host = probe(proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512), env=env, metadata_path=[])

    assert host.platform == Platform("cuda", "sm_89", "NVIDIA L4", 2, ("avx2", "avx512"))


def test_unreadable_or_unrunnable_tools_never_raise(tmp_path):
    tools = CannedTools(
        {
            "nvidia-smi": 'Field "compute_cap" is not a valid field to query.\n',
            "hl-smi": PermissionError(13, "Permission denied"),
        }
    )
    env = tools_on_path(tmp_path, {"nvidia-smi": "exit 99", "hl-smi": "exit 99"})

    host = probe(proc_root=fake_proc(tmp_path, "x86_64", X86_AVX512), run=tools, env=env, metadata_path=[])

    assert host.platform.device == "cpu"
    assert [note.split(" ")[0] for note in host.notes] == ["nvidia-smi", "hl-smi"]


def test_probe_does_not_import_torch():
    try:
        version("torch")
    except PackageNotFoundError:
        pytest.skip("torch is not installed, so not importing it proves nothing")
    script = textwrap.dedent("""\
        import sys
        from prebake.engine.common.probe import probe
        host = probe()
        assert host.software.torch, host
        print("torch" in sys.modules, "triton" in sys.modules)
    """)

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_current_host_runs_the_probe_once_per_process(monkeypatch):
    """doit asks for the host per task: nvidia-smi and hl-smi must not run once per task."""
    import prebake.engine.common.probe as probe_module

    runs: list[str] = []
    real = probe_module.probe
    monkeypatch.setattr(probe_module, "probe", lambda **kw: runs.append("probe") or real(**kw))
    current_host.cache_clear()
    try:
        hosts = [current_host() for _ in range(3)]
    finally:
        current_host.cache_clear()
    assert runs == ["probe"] and all(h is hosts[0] for h in hosts)


def test_a_package_an_engine_declares_is_probed_and_keyed_by_its_factor(tmp_path):
    host = probe(
        proc_root=fake_proc(tmp_path, "x86_64", X86_AMX),
        run=CannedTools({"hl-smi": "HL-325L, 1.21.0-ca59b5a\n"}),
        env=tools_on_path(tmp_path, {"hl-smi": "exit 99"}),
        metadata_path=fake_site(
            tmp_path, {"torch": "2.6.0+hpu.1.21.0.555", "habana-torch-plugin": "1.21.0.555", "vllm-gaudi": "0.11.2"}
        ),
        packages=VLLM_PACKAGES,
    )
    assert host.software.package_factors(["vllm_gaudi", "vllm"]) == {"vllm_gaudi": "0.11.2", "vllm": "none"}
    assert "vllm_gaudi" not in host.software.factors()  # only the kinds of the engine that declares it keep it
    with pytest.raises(
        PrebakeError, match=r"software factor sglang was not probed.*declare it in the engine's adapter"
    ):
        host.software.package_factors(["sglang"])


def test_every_software_field_is_a_key_factor_without_a_list_to_extend():
    """A field added to Software reaches every key by itself: factors() is derived from the fields."""
    names = {f.name for f in dataclasses.fields(Software)} - {"packages"}
    assert set(Software("3.12").factors()) == names
    with pytest.raises(PrebakeError, match="not one of the probe's own"):
        Package("torch", ("torch",), "pkg:pypi/torch")
