"""docs/architecture.md's layers, checked on the source: imports point only down, no package
imports another in a circle, and the decoding core needs neither diffusers nor transformers."""

import ast
import subprocess
import sys

from conftest import ROOT

# rank of each package; a module may import its own package and packages of a lower or equal rank
# (equal only across, never in a circle: see the cycle test)
LAYERS = {
    "visualspec.assets": 0,  # the shipped models: data, no imports
    "visualspec.core": 0,
    "visualspec.worlds": 0,
    "visualspec.drafters": 1,
    "visualspec.models": 1,
    "visualspec.pipelines": 2,
    "visualspec.text": 2,
    "visualspec.video": 2,
    "visualspec.eval": 3,
    "visualspec.training": 3,
    "visualspec.tools": 4,
    "app": 5,
    "benchmarks": 5,
}
FOLDERS = {"models": "visualspec.models", "pipelines": "visualspec.pipelines", "assets": "visualspec.assets"}  # installed under visualspec


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in FOLDERS:
        parts = FOLDERS[parts[0]].split(".") + parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def package_of(module):
    for package in sorted(LAYERS, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    return None


def source_files():
    folders = ["visualspec", "models", "pipelines", "assets", "benchmarks"]
    return [p for folder in folders for p in (ROOT / folder).rglob("*.py")] + [ROOT / "app.py"]


def imports_of(path, module=None):
    """Every module the file imports, at any depth (function-level imports included), resolved."""
    module = module or module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            found.append(name)
            found += [f"{name}.{alias.name}" for alias in node.names]  # `from pkg import module`
    return found


def package_edges(files=None):
    """{(package, imported package): [files]} over ``files`` ([(path, module name)], default: the source)."""
    edges = {}
    for path, module in files or [(p, module_name(p)) for p in source_files()]:
        source = package_of(module)
        if source is None:  # visualspec/__init__.py: the public façade over every layer
            continue
        for name in imports_of(path, module):
            target = package_of(name)
            if target is not None and target != source:
                edges.setdefault((source, target), []).append(path.name)
    return edges


def test_every_module_belongs_to_a_layer():
    loose = [str(p.relative_to(ROOT)) for p in source_files()
             if package_of(module_name(p)) is None and module_name(p) != "visualspec"]
    assert loose == []


def upward(edges):
    return {f"{s} -> {t}": files for (s, t), files in edges.items() if LAYERS[t] > LAYERS[s]}


def test_imports_point_only_down():
    assert upward(package_edges()) == {}


def test_no_import_cycles_between_packages():
    graph = {}
    for source, target in package_edges():
        graph.setdefault(source, set()).add(target)

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, seen + (n,))) for n in graph.get(start, ()))

    assert [p for p in graph if reaches(p, p)] == []


def test_the_core_imports_only_torch_numpy_scipy_pil_and_the_standard_library():
    core = [p for p in source_files() if package_of(module_name(p)) == "visualspec.core"]
    outside = {}
    for path in core:
        for name in imports_of(path):
            top = name.split(".")[0]
            if top not in ("torch", "numpy", "scipy", "PIL", "visualspec", "__future__") \
                    and top not in sys.stdlib_module_names:
                outside.setdefault(str(path.relative_to(ROOT)), []).append(name)
            elif top == "visualspec" and package_of(name) not in ("visualspec.core", None):
                outside.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert outside == {}


def test_importing_the_core_loads_neither_diffusers_nor_transformers():
    code = ("import sys, visualspec.core.engine, visualspec.core.window, visualspec.core.lossless, "
            "visualspec.core.multidraft, visualspec.drafters; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'diffusers', 'transformers'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_checks_catch_an_upward_import(tmp_path):
    """Control: a core module importing the pipelines, or a drafter importing the command line, is
    reported, whether the import is relative, absolute or inside a function."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..pipelines import llamagen\n\ndef f():\n    import visualspec.tools.cli\n")
    edges = package_edges([(probe, "visualspec.core.probe"), (probe, "visualspec.drafters.probe")])
    assert set(upward(edges)) == {"visualspec.core -> visualspec.pipelines", "visualspec.core -> visualspec.tools",
                                  "visualspec.drafters -> visualspec.pipelines", "visualspec.drafters -> visualspec.tools"}
