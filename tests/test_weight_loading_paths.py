"""Every load of a model's weights in the tree goes through the project's kernel-path choice
(cpu_buffers): llama.cpp's default model parameters take AMX wherever the build has it, and a
CPU that lists AMX but traps its tile instructions kills the process that loaded them, a
pytest worker included. So only the sanctioned modules below may name llama.cpp's loaders or
make a kernel path with every extra buffer type by hand; tests and benchmarks use
llamabatch/llama/direct_load.py or cpu_kernels.high_level_llama."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("llamabatch", "tests", "benchmarks", "examples")

# llama.cpp's ways to load weights (the C API through llama-cpp-python, and its Python classes)
LOADERS = {"llama_model_default_params", "llama_model_load_from_file", "llama_load_model_from_file",
           "llama_model_load_from_splits", "Llama", "LlamaModel"}

# A kernel path made by hand with every extra buffer type (AMX included) skips the choice too.
HAND_MADE_DEFAULT = "KernelPath(use_extra_bufts=True)"

# module -> the loaders it may name, each because it applies the kernel path itself
SANCTIONED = {
    "llamabatch/llama/load.py": {"llama_model_load_from_file"},  # the engine's load, params from cpu_kernels
    "llamabatch/llama/cpu_kernels.py": {"llama_model_default_params", "Llama"},  # model_params, high_level_llama
    "llamabatch/llama/direct_load.py": {"llama_model_load_from_file"},  # vocab_only: no weights, no kernels
    "llamabatch/kernel_paths/cpu_buffers.py": {HAND_MADE_DEFAULT},  # resolve(): the choice itself
    "llamabatch/llama/amx_probe.py": {HAND_MADE_DEFAULT},  # the probe, only ever in a throwaway process
    # compares llama.cpp's own choice with pinned CPU_REPACK only where the build has no other extra type
    "tests/test_cpu_buffers_model.py": {HAND_MADE_DEFAULT},
}


def named_loaders(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, name) for each place `source` names one of llama.cpp's loaders in code (a call,
    an attribute, an import; docstrings and comments that mention them do not count)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Name) and node.id in LOADERS:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in LOADERS:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found.extend((node.lineno, alias.name) for alias in node.names if alias.name in LOADERS)
        if isinstance(node, ast.Call) and _is_hand_made_default(node):
            found.append((node.lineno, HAND_MADE_DEFAULT))
    return sorted(found)


def _is_hand_made_default(call: ast.Call) -> bool:
    """KernelPath(name, True, ...) or KernelPath(..., use_extra_bufts=True)."""
    func = call.func
    if (func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)) != "KernelPath":
        return False
    given = call.args[1:2] + [k.value for k in call.keywords if k.arg == "use_extra_bufts"]
    return any(isinstance(value, ast.Constant) and value.value is True for value in given)


def unsanctioned_loads(root: Path) -> list[str]:
    """'file:line: name' for each loader named outside the module sanctioned for it."""
    out = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            allowed = SANCTIONED.get(rel, set())
            for line, name in named_loaders(path.read_text(encoding="utf-8"), rel):
                if name not in allowed:
                    out.append(f"{rel}:{line}: {name}")
    return out


def test_nothing_loads_weights_around_the_kernel_path_choice():
    found = unsanctioned_loads(ROOT)
    assert not found, ("llama.cpp's default weight layout (AMX where built in) loaded outside the kernel-path "
                       "choice; use llamabatch.llama.direct_load (load_weights, load_vocabulary) or "
                       "cpu_kernels.high_level_llama:\n" + "\n".join(found))


def test_the_scan_finds_each_way_to_load_and_names_file_and_line(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        '"""llama_cpp.Llama(...) in a docstring is prose."""\n'
        "import llama_cpp\n"
        "from llama_cpp import Llama\n"
        "params = llama_cpp.llama_model_default_params()  # comment: Llama(\n"
        "model = llama_cpp.llama_model_load_from_file(b'm.gguf', params)\n"
        "llm = llama_cpp.Llama(model_path='m.gguf')\n"
        "old = llama_cpp.llama_load_model_from_file\n"
        "amx = KernelPath('llama.cpp default', True, False, 'mine')\n"
        "also = cpu_buffers.KernelPath(name='x', use_extra_bufts=True, pin_repack=False, why='')\n"
        "fine = KernelPath('plain', False, False, 'no extra buffer types')\n")
    assert unsanctioned_loads(tmp_path) == [
        "tests/test_x.py:3: Llama", "tests/test_x.py:4: llama_model_default_params",
        "tests/test_x.py:5: llama_model_load_from_file", "tests/test_x.py:6: Llama",
        "tests/test_x.py:7: llama_load_model_from_file", f"tests/test_x.py:8: {HAND_MADE_DEFAULT}",
        f"tests/test_x.py:9: {HAND_MADE_DEFAULT}"]


def test_a_sanctioned_module_may_name_only_its_own_loaders(tmp_path):
    (tmp_path / "llamabatch" / "llama").mkdir(parents=True)
    (tmp_path / "llamabatch" / "llama" / "load.py").write_text(
        "from llama_cpp import llama_cpp as C\n"
        "model = C.llama_model_load_from_file(b'm.gguf', params)\n"
        "params = C.llama_model_default_params()\n")
    assert unsanctioned_loads(tmp_path) == ["llamabatch/llama/load.py:3: llama_model_default_params"]


def test_every_sanctioned_module_exists_and_names_what_it_is_allowed():
    # a module renamed or a loader dropped leaves a stale exception that would let a load through
    for rel, allowed in SANCTIONED.items():
        names = {name for _line, name in named_loaders((ROOT / rel).read_text(encoding="utf-8"), rel)}
        assert allowed <= names, f"{rel} no longer names {sorted(allowed - names)}: drop it from SANCTIONED"
