"""Files beside a profile that are named like a module the run or Python imports (S-BYO-3).

The profile's folder is appended to the search path, so in the run itself such a file
never stands in for the module: the module wins and the file is never imported (a
`data.py` of yours cannot be named as `data:rows`). A script run from that folder, or a
profile importing its neighbour, puts the folder first instead, and then the file does
stand in for it: a `profile.py` hides Python's `profile`, which transformers' imports
reach. The pre-flight notes each such file, naming a rename; it refuses nothing.
"""

from __future__ import annotations

import pkgutil
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Top-level modules of the packages pyproject.toml lists (and the GPU extra's vLLM) plus
# those they import by name on every run, as `import` spells them.
IMPORTED_PACKAGES = (
    "torch", "transformers", "tokenizers", "safetensors", "datasets", "prefect", "ray", "pydantic", "fsspec",
    "numpy", "av", "matplotlib", "tensorboard", "nixl", "xxhash", "peft", "vllm", "huggingface_hub", "jinja2",
    "pyarrow", "yaml", "requests", "httpx",
)


def project_packages() -> set[str]:
    """This project's own top-level packages (algorithm, configs, data, ...), less tests/:
    a project's own tests/ folder is no module a config names."""
    return {module.name for module in pkgutil.iter_modules([str(PROJECT_ROOT)]) if module.ispkg} - {"tests"}


def shadowing_notes(profile: str | Path) -> list[str]:
    """One note per module or package in the profile's folder whose name a standard
    module, a package the project imports or one of the project's own packages has;
    nothing for the project's own configs/ folder."""
    folder = Path(profile).resolve().parent
    if folder == PROJECT_ROOT / "configs" or not folder.is_dir():
        return []
    own = project_packages()
    notes = []
    for module in sorted(pkgutil.iter_modules([str(folder)]), key=lambda found: found.name):
        name = module.name
        entry, rename = (folder / name, f"my_{name}/") if module.ispkg else (folder / f"{name}.py", f"my_{name}.py")
        if not entry.exists():  # a compiled extension or another kind of module file: not what the docs suggest
            continue
        if name in sys.stdlib_module_names or name in IMPORTED_PACKAGES:
            what = f"Python's standard module {name!r}" if name in sys.stdlib_module_names else (
                f"the package {name!r} the run imports")
            harm = (f"a script run from {folder}, or a file there importing it by name, gets this file instead and "
                    "can fail to import transformers")
        elif name in own:
            what = f"this project's package {name!r}"
            harm = (f"a config key naming `{name}:...` or `{name}.<module>:...` reaches the project's package, "
                    "not this file")
        else:
            continue
        notes.append(
            f"{entry} is named like {what}: the run imports that module, never this file (the profile's folder comes "
            f"last on the path); {harm}. Rename it (e.g. {rename}) and the keys and imports that name it"
        )
    return notes
