"""The shipped models are package data: a wheel holds every file of assets/, and the package
installed from it (not editable) generates an image and a video on its default models from another
folder."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT


def tracked(folder):
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.split()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of the tracked files (nothing is written into the checkout)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout to list its files")
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    for name in tracked("."):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist")], check=True, capture_output=True)
    return next((tmp / "dist").glob("visualspec-*.whl"))


def test_the_wheel_holds_every_shipped_model_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = [name for name in tracked("assets")]
    assert len(assets) > 20
    missing = [name for name in assets if "visualspec/" + name not in names]
    assert missing == []
    assert "visualspec/core/engine.py" in names and "visualspec/models/llamagen.py" in names
    modules = [name for name in tracked("visualspec") if name.endswith(".py")]
    assert [name for name in modules if name not in names] == []  # every subpackage is listed in pyproject.toml
    assert not any(name.startswith(("tests/", "assets/", "models/", "pipelines/")) for name in names)


def test_the_installed_package_generates_on_its_shipped_model_from_another_folder(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import visualspec.assets as a, visualspec.tools.cli as c, visualspec.tools.loading as m; "
            "print(a.SHAPES_T2I); print(m.default_model()[1]); "
            # a fixed window: the installed package is tested here, window="auto" by the CLI tests
            "assert c.main(['generate', 'a photo of a red circle', '--seed', '0', '--window', '8', "
            "'-o', 'out.png']) == 0; "
            "raise SystemExit(c.main(['video', '--actions', 'right,up', '--frames', '4', '-o', 'play.gif']))")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    folder, description = result.stdout.splitlines()[:2]
    assert folder.startswith(str(target)) and description == "shipped shapes model"
    assert (tmp_path / "out.png").stat().st_size > 0 and (tmp_path / "play.gif").stat().st_size > 0
