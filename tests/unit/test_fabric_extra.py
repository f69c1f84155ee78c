"""ddops.fabric is an optional extra: without Fabric it says how to install it, and the CLI never loads it."""

from __future__ import annotations

import subprocess
import sys


def test_importing_ddops_fabric_without_fabric_names_the_extra():
    code = ("import sys; sys.modules['fabric'] = None\n"
            "try:\n    import ddops.fabric\nexcept ImportError as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'ddops[fabric]'" in out


def test_the_exec_command_does_not_load_fabric():
    code = ("import sys\nfrom ddops.cli.app import main\n"
            "try:\n    main(['exec', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('loaded' if 'fabric' in sys.modules else 'not loaded')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("not loaded")
