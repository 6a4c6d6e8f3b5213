"""The package as a user installs it: one top-level name, `ablate`, and an import graph that flows one way.

The checks read the code (ast), so a lazy import inside a function counts as much as one at the top; an import
under `if TYPE_CHECKING:` does not run and does not count."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO, TINY_MODEL, TINY_TASK, TINY_TRAIN

# Repository folder -> the package it installs as (pyproject.toml's package-dir).
FOLDERS = {"ablate": "ablate", "schema": "ablate.schema", "models": "ablate.models", "harness": "ablate.harness",
           "analysis": "ablate.analysis", "reports": "ablate.reports", "ablations": "ablate.ablations",
           "bench": "ablate.bench"}  # fmt: skip
# Which layer may import which: data flows spec -> queue -> trial -> artifacts -> report, never back.
MAY_IMPORT = {
    "models": set(),
    "ablations": set(),  # the bundled study files
    "schema": {"models", "ablations"},  # the study file, the configs, the trial records: torch-free
    "analysis": {"schema"},  # so that the sweep's looks and the report judge claims with the same code
    "harness": {"schema", "models", "analysis", "ablations"},
    "reports": {"schema", "models", "harness", "analysis"},
    "bench": {"schema", "models", "harness"},
    "ablate": {"schema", "models", "harness", "analysis", "reports", "bench"},  # the command line and the API
}
# What a torch-free reader must not load: torch, Lightning, a task's builder or a tokenizer library.
HEAVY = ("torch", "lightning", "pytorch_lightning", "tokenizers", "sacrebleu", "datasets", "ablate.harness.tasks")
LIBRARIES = ("optuna", "lightning", "pytorch_lightning")
PUBLIC = {"os._exit"}  # the standard library's documented names that start with an underscore


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def runtime_nodes(tree: ast.AST):
    """Every node outside `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from runtime_nodes(node)


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports at run time."""
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ablate"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("ablate")}
    return {m for m in found if m in known}


def layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") and module.split(".")[1] in MAY_IMPORT else "ablate"


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first search meets: a node reached again while still on the path."""
    on_path, done, found = [], set(), []

    def visit(m: str) -> None:
        on_path.append(m)
        for t in sorted(graph[m]):
            if t in on_path:
                found.append(" -> ".join(on_path[on_path.index(t) :] + [t]))
            elif t not in done:
                visit(t)
        on_path.pop()
        done.add(m)

    for m in sorted(graph):
        if m not in done:
            visit(m)
    return found


def test_layers_import_only_downstream_and_modules_form_no_cycle():
    known = modules()
    graph = {m: imports(path, known) - {m} for m, path in known.items()}
    wrong = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
             if layer(t) != layer(m) and layer(t) not in MAY_IMPORT[layer(m)]]  # fmt: skip
    assert not wrong, "imports against the flow:\n" + "\n".join(sorted(wrong))
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_no_folder_imports_a_folder_that_imports_it_back():
    """Folders as the code imports them (not as MAY_IMPORT allows): no loop, however long."""
    known = modules()
    folders: dict[str, set[str]] = {layer(m): set() for m in known}
    for m, path in known.items():
        folders[layer(m)] |= {layer(t) for t in imports(path, known)} - {layer(m)}
    assert not cycles(folders), cycles(folders)
    assert not cycles({folder: set(allowed) for folder, allowed in MAY_IMPORT.items()})


def test_the_metric_registry_imports_nothing_of_the_project():
    """harness/, analysis/ and reports/ read it (and models/ may, one day): it must pull in nothing else."""
    known = modules()
    assert imports(known["ablate.schema.metric_registry"], known) == set()


def test_the_check_sees_a_backward_import_and_a_cycle(tmp_path):
    """The graph test above fails on what it exists to catch."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from ablate.reports.render import x\n\ndef f():\n    from ablate.b import y\n")
    b.write_text("import ablate.a\nif TYPE_CHECKING:\n    from ablate.reports import z\n")
    known = {"ablate.a": a, "ablate.b": b, "ablate.reports.render": a, "ablate.reports": b}
    assert imports(a, known) == {"ablate.reports.render", "ablate.b"}
    assert imports(b, known) == {"ablate.a"}


def heavy_modules_loaded(imports: str) -> list[str]:
    """The HEAVY modules (or any of their submodules) that running `imports` in a fresh Python loads."""
    code = (f"import sys; {imports}; print(sorted({{h for h in {HEAVY!r} for m in sys.modules "
            f"if m == h or m.startswith(h + '.')}}))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout)


def test_the_analysis_loads_no_torch_no_task_and_no_tokenizer():
    """The sweep's adaptive looks and the report judge claims through analysis/, which reads only the schema:
    not the trial's torch and Lightning, not a task's builder and its libraries."""
    modules = " ".join(f"import {m};" for m in sorted(modules_of("analysis")))
    assert heavy_modules_loaded(modules.rstrip(";")) == []


def test_the_launchers_and_their_command_lines_import_no_torch():
    """A SLURM login node or a Ray actor builds a worker's command line, and a sweep plans its launcher,
    without torch's and Lightning's seconds and memory (harness/launchers/commands.py), nor a task's."""
    from ablate.harness.launchers import LAUNCHERS

    loaded = heavy_modules_loaded(
        f"import importlib; [importlib.import_module(m) for m in {sorted(LAUNCHERS.values())!r}]; "
        "import ablate.harness.launchers.commands"
    )
    assert loaded == []


def modules_of(folder: str) -> list[str]:
    return [m for m in modules() if layer(m) == folder]


def private_uses(path: Path) -> list[str]:
    """`_name` attributes and imports of Optuna / Lightning outside compat.py: imports of a private name or
    module, and attribute reads `x._y` on anything but self / cls (the project's own classes keep their
    privates on self)."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            names = [node.module, *(a.name for a in node.names)]
            found += [f"{path.name}:{node.lineno} import {n}" for n in names
                      if any(p.startswith("_") for p in n.split("."))]  # fmt: skip
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            mine = isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}
            if not mine and ast.unparse(node) not in PUBLIC:
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_private_library_attributes_are_used_in_compat_only():
    uses = [u for m, path in modules().items() if m != "ablate.harness.compat" for u in private_uses(path)]
    assert not uses, "private attributes outside harness/compat.py:\n" + "\n".join(uses)
    assert private_uses(REPO / "harness" / "compat.py")  # the check finds what compat.py holds


@pytest.mark.slow  # a wheel, a virtualenv and a sweep: about a minute
def test_installed_wheel_holds_only_ablate_and_runs_beside_a_users_own_models_py(tmp_path):
    """A wheel installed in a fresh virtualenv: no `models`, `harness` or `reports` at the top of
    site-packages, and a sweep started from a folder holding a models.py, harness/ and reports/ of its own
    never imports them."""
    # Built from a copy of the checkout's files: setuptools writes build/ and *.egg-info beside its input.
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()  # fmt: skip
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels), str(source)], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = wheels.glob("*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ablate"}

    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing but the new install
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, env=env,
                   capture_output=True, timeout=300)  # fmt: skip
    # Then the dependencies, from this environment's site-packages (after the install, so pip does not see
    # this checkout's own install there); a path a .pth file adds runs none of that folder's own .pth
    # files, so the checkout's editable install stays out of the new environment.
    new_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True, env=env).stdout.strip()  # fmt: skip
    (Path(new_site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "course"
    for package in ("harness", "reports", "analysis"):
        (work / package).mkdir(parents=True)
        (work / package / "__init__.py").write_text(
            f'raise ImportError("the folder\'s own {package} was imported")\n'
        )
    (work / "models.py").write_text('raise ImportError("the folder\'s own models.py was imported")\n')
    study = {
        "name": "course", "base": {"task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "variants": {"lstm": {"preset": "lstm"}, "transformer": {"preset": "transformer"}},
        "seeds": [0], "metric": {"name": "test/tok_acc", "direction": "maximize"},
    }  # fmt: skip
    (work / "study.yaml").write_text(yaml.safe_dump(study))
    check = subprocess.run(
        [python, "-c", "import models"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert "No module named 'models'" in check.stderr
    check = subprocess.run([python, "-c", "import ablate.models, ablate.harness.trial; print(ablate.models.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, env=env)  # fmt: skip
    assert check.returncode == 0 and check.stdout.startswith(new_site), check.stderr
    sweep = subprocess.run([venv / "bin" / "ablate", "sweep", "study.yaml", "--out", "runs", "--wandb", "disabled",
                            "--workers", "1"], cwd=work, capture_output=True, text=True, env=env, timeout=600)  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert (work / "runs" / "course" / "report" / "report.html").is_file()
