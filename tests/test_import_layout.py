"""How the repository's code finds its imports: through packaging and pytest's `pythonpath`, never by path edits.

The examples share code through the installed `panm_hf.pipelines` (as transformers' example scripts share
nothing by path), `research/` is a package installed beside `panm_hf`, and the memory core stays free of both.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATH_EDIT = "sys" + ".path"  # spelled apart so this file does not match its own search
SKIPPED_DIRS = {".venv", ".git", "build", "dist", "node_modules", "__pycache__"}


def python_files() -> list[Path]:
    """The repository's own .py files: git's tracked and not-ignored ones (no run outputs, virtualenv or build
    output); outside a git checkout, every .py file but those in hidden or build folders."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if listed.returncode == 0 and listed.stdout.strip():
        return sorted(ROOT / name for name in listed.stdout.split("\n") if name and (ROOT / name).is_file())
    return sorted(
        path for path in ROOT.rglob("*.py")
        if not any(part in SKIPPED_DIRS or part.startswith(".") for part in path.relative_to(ROOT).parts[:-1])
    )  # fmt: skip


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth, as written (a relative one keeps its leading dots)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
    return names


def top_level(modules: set[str]) -> set[str]:
    return {module.split(".")[0] for module in modules if not module.startswith(".")}


def test_no_file_edits_the_import_path():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in python_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if PATH_EDIT in line
    ]
    assert offenders == [], f"{PATH_EDIT} edits (use packaging or pytest's pythonpath): {offenders}"


def test_no_example_imports_another_examples_script():
    folders = sorted(path for path in (ROOT / "examples").iterdir() if path.is_dir())
    scripts = {folder.name: {path.stem for path in folder.glob("*.py")} for folder in folders}
    borrowed = []
    for folder in folders:
        others = set().union(*(names for name, names in scripts.items() if name != folder.name))
        for path in folder.glob("*.py"):
            for module in sorted((top_level(imported_modules(path)) & others) - scripts[folder.name]):
                borrowed.append(f"{path.relative_to(ROOT)} imports {module}")
            assert "spec_from_file_location" not in path.read_text(encoding="utf-8"), path
    assert borrowed == [], f"shared code belongs in panm_hf.pipelines: {borrowed}"


def test_pytest_pythonpath_has_every_example_folder_and_their_names_are_distinct():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    folders = sorted(path for path in (ROOT / "examples").iterdir() if path.is_dir() and any(path.glob("*.py")))
    expected = {str(path.relative_to(ROOT)) for path in folders}
    assert expected <= set(settings["pythonpath"])
    stems = [path.stem for folder in [ROOT / "benchmarks", *folders] for path in folder.glob("*.py")]
    assert len(stems) == len(set(stems)), "two scripts on pytest's pythonpath share a module name"


def test_the_core_imports_neither_the_pipelines_nor_research():
    core = [path for path in (ROOT / "panm_hf").rglob("*.py") if "pipelines" not in path.parts]
    for path in core:
        modules = imported_modules(path)
        assert not any("pipelines" in module for module in modules), path
        assert "research" not in top_level(modules), path


def test_importing_the_package_loads_no_example_dependencies():
    """`import panm_hf`, then `import panm_hf.pipelines` (one interpreter): neither loads `datasets` or the
    pipelines' model builders."""
    loaded = "('datasets', 'panm_hf.pipelines.seq2seq')"
    show = f"print(sorted(m for m in {loaded} if m in sys.modules))"
    code = f"import sys; import panm_hf; {show}; import panm_hf.pipelines; {show}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's panm_hf, whatever is installed
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    assert result.stdout.split() == ["[]", "[]"]
