"""The product and the lab stay apart. dashgen/ is what a wheel installs; lab/ holds a checkout's
measuring scripts, which import dashgen and never the other way round: an installed dashgen has
no lab/ to import from. So no module of the package imports a lab module, every relative import
in it names a module the package has, no lab script is also a module of the package, and the
package list of pyproject.toml leaves lab/ out of the wheel."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dashgen"
LAB = ROOT / "lab"
LAB_MODULES = {path.stem for path in LAB.glob("*.py")}
PACKAGE_FILES = sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _exists(parts: list[str]) -> bool:
    """Whether dotted `parts` is a module or package of the checkout."""
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path):
    """(line, absolute module parts, names) for every import in a file; relative imports are
    resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module_name = _module_name(path)
    package = module_name if path.name == "__init__.py" else module_name[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split("."), []
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = base + (node.module.split(".") if node.module else [])
            yield node.lineno, module, [alias.name for alias in node.names]


def test_the_lab_has_scripts_to_keep_apart():
    assert {"calibrate", "compare_trees", "sass_compare"} <= LAB_MODULES
    assert not (ROOT / "scripts").exists()


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_never_imports_the_lab(path):
    for line, module, names in _imports(path):
        # `import calibrate`, `from lab.x import y`, `from .calibrate import fit` (a module left
        # behind by a move), or `from .tools import calibrate`
        lab = module[0] == "lab" or module[0] in LAB_MODULES or module[-1] in LAB_MODULES or (
            (ROOT.joinpath(*module) / "__init__.py").is_file() and set(names) & LAB_MODULES)
        assert not lab, (f"{path.relative_to(ROOT)}:{line} imports from {'.'.join(module)} a "
                         f"lab module: an installed dashgen has no lab/")


@pytest.mark.parametrize("path", PACKAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_import_names_a_module_of_the_package(path):
    """A module moved out of dashgen/ leaves no `from .tools.x import` behind."""
    for line, module, _ in _imports(path):
        if module[:1] != ["dashgen"]:
            continue
        assert _exists(module), f"{path.relative_to(ROOT)}:{line}: no module {'.'.join(module)}"


def test_no_lab_script_is_a_module_of_the_package():
    package_modules = {path.stem for path in PACKAGE_FILES}
    assert not LAB_MODULES & package_modules, sorted(LAB_MODULES & package_modules)
    assert not (PACKAGE / "lab").exists()


def test_the_wheel_leaves_the_lab_out():
    tomllib = pytest.importorskip("tomllib")
    setuptools = pytest.importorskip("setuptools")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = setuptools.find_packages(str(ROOT), include=include)
    assert "dashgen" in packages
    assert all(p.split(".")[0] == "dashgen" for p in packages), packages
