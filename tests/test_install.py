"""What a fresh install gives: ``inferd --version``, wheels that build offline, and
PyTorch as an extra (``inferd[torch]``) whose absence is a clear load error."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Runs an inferd entry point in a process where ``import <missing>`` fails, as without the extra.
_WITHOUT = "import sys; sys.modules[{missing!r}] = None; from {module} import main; sys.exit(main({argv!r}))"


def _without(missing: str, module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT.format(missing=missing, module=module, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)


def _without_torch(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return _without("torch", module, *argv)


def test_version_flag() -> None:
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"inferd {version('inferd')}", proc.stderr


def test_a_torchscript_model_without_torch_fails_to_load_naming_the_model_and_the_extra(
        example_repository: Path, tmp_path: Path) -> None:
    for name in ("simple", "torch_add_sub"):
        shutil.copytree(example_repository / name, tmp_path / name)
    proc = _without_torch("inferd.cli", "check", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if line.startswith(("simple", "torch")))
    assert lines["simple"].startswith("READY")
    assert "model 'torch_add_sub'" in lines["torch_add_sub"]
    assert "pip install 'inferd[torch]'" in lines["torch_add_sub"]


def test_the_example_repository_builds_without_torch_skipping_its_torch_models(tmp_path: Path) -> None:
    proc = _without_torch("inferd.examples.build", "--output", str(tmp_path), "--model", "simple",
                          "--model", "torch_mlp")
    assert proc.returncode == 0, proc.stderr
    assert "torch_mlp: skipped, building it needs PyTorch: pip install 'inferd[torch]'" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["simple"]


def _wheel(source: Path, out: Path) -> zipfile.ZipFile:
    """``pip wheel`` of a copy of ``source`` (no network: no deps, no build isolation)."""
    src = out / "src"
    shutil.copytree(source, src, ignore=shutil.ignore_patterns(
        ".venv", "model_repository", "__pycache__", "*.egg-info", "build", ".git", "bench"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def _metadata(wheel: zipfile.ZipFile) -> list[str]:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return wheel.read(name).decode().splitlines()


@pytest.mark.timeout(600)
def test_the_server_wheel_builds_offline_with_torch_as_an_extra(tmp_path: Path) -> None:
    wheel = _wheel(ROOT, tmp_path)
    names = set(wheel.namelist())
    assert {"inferd/cli.py", "inferd/py.typed", "inferd/_proto/grpc_service_pb2.py",
            "triton_python_backend_utils/__init__.py"} <= names
    assert not any(n.startswith(("tests/", "clients/", "inferd_client/", "bench/")) for n in names)
    # Test and benchmark harnesses stay out (bench/replicas.py); the example repository, a user command, ships.
    assert "inferd/deploy/replicas.py" not in names and "inferd/examples/command.py" in names
    requires = [line for line in _metadata(wheel) if line.startswith("Requires-Dist:")]
    torch = [line for line in requires if line.startswith("Requires-Dist: torch")]
    assert torch and all('extra == "torch"' in line for line in torch), requires
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "inferd = inferd.cli:main" in wheel.read(entry_points).decode()


@pytest.mark.timeout(600)
def test_the_client_wheel_builds_offline_and_carries_its_stubs(tmp_path: Path) -> None:
    wheel = _wheel(ROOT / "clients", tmp_path)
    names = set(wheel.namelist())
    assert {"inferd_client/__init__.py", "inferd_client/py.typed", "inferd_client/_proto/_pool.py",
            "inferd_client/_proto/grpc_service_pb2_grpc.py", "inferd_client/_proto/grpc_service_pb2.pyi"} <= names
    assert not any(n.startswith("examples/") for n in names)
    lines = [line.split(":", 1)[1].strip() for line in _metadata(wheel) if line.startswith("Requires-Dist:")]
    requires = {line.split(">")[0].split("<")[0] for line in lines if "extra ==" not in line}
    assert requires == {"grpcio", "protobuf", "numpy"}
    # AsyncHttpClient's aiohttp only with the aio-http extra
    assert {line.split(">")[0] for line in lines if "extra ==" in line} == {"aiohttp"}


def test_perf_plot_without_matplotlib_names_the_requirement_of_the_perf_extra(tmp_path: Path) -> None:
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["perf"]
    (requirement,) = [r for r in extra if r.startswith("matplotlib")]
    proc = _without("matplotlib", "inferd.cli", "perf", "-m", "simple", "-u", "127.0.0.1:1",
                    "--plot", str(tmp_path / "plot.png"))
    assert proc.returncode == 1
    assert f"--plot needs matplotlib, which is not installed: pip install '{requirement}'" in proc.stderr


# What ties a file to this machine's layout: the shared tools folder beside the checkout, the
# workplace's absolute paths, its local package index, or comments about what lies on its disk.
# (Written so that this file's own source does not match.)
_MACHINE_PATHS = re.compile(r"\.\./shared\b|(?<![\w.])/(?:work|root)/|/opt/py[p]i|/home/(?!inferd\b)\w+"
                            r"|lies on local dis[k]")


def test_no_tracked_file_depends_on_this_machines_layout() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    found = []
    for name in listed.stdout.decode().split("\0"):
        path = ROOT / name
        if not name or path.is_symlink() or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # models, images: not text a path could hide in
            continue
        found += [f"{name}:{n}: {line.strip()[:200]}" for n, line in enumerate(text.splitlines(), 1)
                  if _MACHINE_PATHS.search(line)]
    assert not found, "\n".join(found)


def test_both_packages_take_their_version_from_the_one_version_file() -> None:
    expected = (ROOT / "VERSION").read_text().strip()
    assert (ROOT / "clients" / "VERSION").resolve() == (ROOT / "VERSION").resolve()
    assert version("inferd") == version("inferd-client") == expected


def test_an_onnx_model_without_onnx_runtime_fails_to_load_naming_both_extras(
        example_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(example_repository / "simple", tmp_path / "simple")
    proc = _without("onnxruntime", "inferd.cli", "check", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("simple")]
    assert "model 'simple'" in line and "pip install 'inferd[onnx]'" in line and "'inferd[onnx-gpu]'" in line


def test_onnxruntime_and_onnxruntime_gpu_together_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.backends import onnxruntime as backend
    from inferd.errors import ConfigError

    monkeypatch.setattr(backend, "_installed_ort", lambda: ["onnxruntime 1.32.0", "onnxruntime-gpu 1.31.1"])
    with pytest.raises(ConfigError, match=r"model 'm': both onnxruntime 1\.32\.0 and onnxruntime-gpu 1\.31\.1"):
        backend._ort("m")
    monkeypatch.setattr(backend, "_installed_ort", lambda: ["onnxruntime 1.32.0"])
    assert backend._ort("m").InferenceSession  # one of the two: the module itself


def test_the_readme_install_block_is_what_the_install_check_runs() -> None:
    """.ci/install_check.py runs README's install lines as written: one per extra of pyproject.toml that the
    README names, each naming this VERSION's wheel, and the extras it names all exist."""
    import importlib.util
    import tomllib

    spec = importlib.util.spec_from_file_location("install_check", ROOT / ".ci" / "install_check.py")
    assert spec and spec.loader
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    lines = check.readme_install_lines()
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    assert {"build", "base", "onnx", "onnx-gpu", "torch", "gpu", "otlp", "perf", "batch"} <= set(lines)
    assert set(lines) - {"build", "base"} <= extras
    expected = (ROOT / "VERSION").read_text().strip()
    assert all(f"inferd-{expected}-py3-none-any.whl" in line for key, line in lines.items() if key != "build")


def test_a_base_install_without_onnx_runs_every_command_but_the_example_builder(tmp_path: Path) -> None:
    """Found by the install check: the examples command imported the ONNX builder as the parser was built,
    so without the onnx package no inferd command ran at all."""
    proc = _without("onnx", "inferd.cli", "check", str(tmp_path))
    assert "No module named" not in proc.stderr, proc.stderr
    proc = _without("onnx", "inferd.cli", "examples", "--list")
    assert proc.returncode == 1
    assert "the onnx package, which is not installed" in proc.stderr and "pip install 'inferd[examples]'" in proc.stderr
