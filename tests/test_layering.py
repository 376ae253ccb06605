"""House rule: nip_core never imports Prefect (nor the orchestration layers)."""

import pkgutil
import subprocess
import sys
from pathlib import Path

import nip_core


def test_no_prefect_import_statement_in_nip_core():
    root = Path(nip_core.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import prefect", "from prefect", "import flows", "from flows",
                                    "import tasks", "from tasks")):
                offenders.append(f"{path}: {stripped}")
    assert offenders == []


def test_importing_every_nip_core_module_loads_no_prefect():
    names = [m.name for m in pkgutil.walk_packages(nip_core.__path__, "nip_core.")
             if not m.name.endswith("__main__")]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        if e.name and e.name.startswith('prefect'): raise\n"
        "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
